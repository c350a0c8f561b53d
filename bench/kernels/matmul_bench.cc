// dcformer-matmul-bench: the CPU backend's matmul kernels (engine/cpu/packed_matrix.h) on the
// weight shapes of a model, against OpenBLAS sgemv/sgemm on fp32 weights, with the memory
// read bandwidth measured in the same run (so the weight GB/s of a decode-sized product can
// be read as a fraction of the roofline).
//
//   dcformer-matmul-bench [--dim 1024 --ffn 2816 --vocab 50257 --rows 1,8,32]
//       [--dtypes f32,f16,bf16,int8,int8a8]
//
// Each case cycles through enough copies of the matrix to exceed the last-level cache (so
// weights come from memory, as in a decode step), runs for at least --min_seconds and
// reports the best time per call, the weight bytes per second and GFLOP/s (2 rows in out).
// The calls run on one team of threads that stays up across them (cpu::RunTeam), as the CPU
// backend's decode step runs its products; --noteam starts the threads for every call.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "engine/common/flag_names.h"
#include "engine/execution/backend_options.h"
#include "engine/cpu/cpu_isa.h"
#include "engine/cpu/packed_matrix.h"
#include "engine/cpu/read_bandwidth.h"
#include "engine/cpu/team.h"

ABSL_FLAG(int, dim, 1024, "model dim E");
ABSL_FLAG(int, ffn, 2816, "FFN size F");
ABSL_FLAG(int, vocab, 50257, "vocabulary (output head rows)");
ABSL_FLAG(std::string, rows, "1,8,32", "rows of x (sequences in a decode step), comma-separated");
ABSL_FLAG(std::string, dtypes, "f32,f16,bf16",
          "weight dtypes: f32, f16, bf16, int8 (weight-only, --group-size columns per "
          "bf16 scale: docs/QUANTIZATION.md) and int8a8 (the same weights, int8 x int8)");
ABSL_FLAG(int, group_size, 64, "input columns per scale of the int8 matrices: 32, 64 or 128");
ABSL_FLAG(std::string, isas, "", "kernels (avx512,avx2,portable); default: the best one");
ABSL_FLAG(bool, blas, true, "also time OpenBLAS on fp32 weights");
ABSL_FLAG(double, min_seconds, 0.3, "minimum time per case");
ABSL_FLAG(bool, team, true,
          "run every call on one persistent team of threads, as a decode step runs its "
          "products (engine/cpu/team.h); --noteam starts the threads per call (OpenMP)");
ABSL_FLAG(int64_t, cache_bytes, int64_t{128} << 20,
          "bytes of matrix copies cycled through (> last-level cache)");

namespace dcf {
namespace {

using Clock = std::chrono::steady_clock;

struct Shape {
  const char* name;
  int64_t out, in;
};

// Best seconds per call of fn(copy) cycling over `copies`.
template <typename Fn>
double TimeBest(int copies, Fn&& fn) {
  fn(0);  // warm-up
  double best = 1e30, spent = 0;
  int i = 0;
  while (spent < absl::GetFlag(FLAGS_min_seconds) || i < 3) {
    const auto t0 = Clock::now();
    fn(i % copies);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::min(best, s);
    spent += s;
    ++i;
  }
  return best;
}

// TimeBest on one team of `threads` threads that stays up across the calls, as a decode
// step's products run: fn(team, copy) on every thread. The leader's clock starts before a
// barrier that every thread passes before the call, and stops after the call's closing
// barrier (cpu::MatMul on a team ends with one), so it covers every thread's share (and one
// barrier, as a step pays between two products).
template <typename Fn>
double TimeBestOnTeam(int threads, int copies, Fn&& fn) {
  double best = 1e30, spent = 0;
  bool done = false;  // written by the leader between two barriers
  cpu::RunTeam(threads, [&](cpu::Team& team) {
    fn(team, 0);  // warm-up
    Clock::time_point t0;
    for (int i = 0;; ++i) {
      if (team.leader()) t0 = Clock::now();
      team.Barrier();  // no thread starts the call before the clock does
      fn(team, i % copies);
      if (team.leader()) {
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        best = std::min(best, s);
        spent += s;
        done = spent >= absl::GetFlag(FLAGS_min_seconds) && i >= 2;
      }
      team.Barrier();
      // Every thread reads `done` before the next call's closing barrier, after which alone
      // the leader writes it again.
      if (done) break;
    }
  });
  return best;
}

std::vector<int> ParseInts(const std::string& list) {
  std::vector<int> v;
  for (absl::string_view p : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    int x;
    if (absl::SimpleAtoi(p, &x) && x > 0) v.push_back(x);
  }
  return v;
}

int Main() {
  const int64_t E = absl::GetFlag(FLAGS_dim), F = absl::GetFlag(FLAGS_ffn),
                V = absl::GetFlag(FLAGS_vocab);
  const std::vector<Shape> shapes = {
      {"wqkv", 3 * E, E}, {"wo", E, E}, {"w1|w3", F, E}, {"w2", E, F}, {"output", V, E}};
  const std::vector<int> rows = ParseInts(absl::GetFlag(FLAGS_rows));
  struct Kind {
    DType dtype;
    bool a8 = false;  // int8 x int8
  };
  std::vector<Kind> dtypes;
  const int group = absl::GetFlag(FLAGS_group_size);
  if (!ValidInt8GroupSize(group)) {
    std::fprintf(stderr, "--group-size: %d (choose 32, 64 or 128)\n", group);
    return 2;
  }
  for (absl::string_view d : absl::StrSplit(absl::GetFlag(FLAGS_dtypes), ',', absl::SkipEmpty())) {
    if (d == "int8" || d == "int8a8") {
      dtypes.push_back({DType::kI8, d == "int8a8"});
      continue;
    }
    auto parsed = ParseComputeDType(d);
    if (!parsed.ok()) {
      std::fprintf(stderr, "--dtypes: %s\n", std::string(parsed.status().message()).c_str());
      return 2;
    }
    dtypes.push_back({*parsed});
  }
  std::vector<cpu::Isa> isas;
  for (absl::string_view n : absl::StrSplit(absl::GetFlag(FLAGS_isas), ',', absl::SkipEmpty())) {
    auto isa = cpu::ParseIsa(std::string_view(n.data(), n.size()));
    if (!isa.has_value()) {
      std::fprintf(stderr, "--isas: unknown kernel '%s'\n", std::string(n).c_str());
      return 2;
    }
    if (cpu::SupportedIsa(*isa) == *isa) isas.push_back(*isa);
  }
  if (isas.empty()) isas.push_back(cpu::ActiveIsa());

  const int threads = omp_get_max_threads();
  const bool on_team = absl::GetFlag(FLAGS_team);
  cpu::MatMulScratch scratch;  // the team's shared row buffers, as the CPU backend keeps one
  const ReadBandwidth bw1 = MeasureReadBandwidth(1);
  const ReadBandwidth bwn = MeasureReadBandwidth(threads);
  std::printf("read bandwidth: %.1f GB/s (1 thread), %.1f GB/s (%d threads)\n", bw1.gb_per_s,
              bwn.gb_per_s, threads);
  std::printf("%-8s %-7s %-9s %5s %10s %9s %9s %7s\n", "matrix", "dtype", "kernel", "rows",
              "us/call", "GB/s", "GFLOP/s", "%bw");

  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const Shape& sh : shapes) {
    std::vector<float> w(sh.out * sh.in);
    for (float& v : w) v = u(rng) * 0.05f;
    const int max_rows = *std::max_element(rows.begin(), rows.end());
    std::vector<float> x(max_rows * sh.in), y(max_rows * sh.out);
    for (float& v : x) v = u(rng);
    const auto report = [&](const char* dtype, const char* kernel, int r, double s, double bytes) {
      const double gbs = bytes / s / 1e9;
      std::printf("%-8s %-7s %-9s %5d %10.1f %9.1f %9.1f %6.0f%%\n", sh.name, dtype, kernel, r,
                  s * 1e6, gbs, 2.0 * r * sh.in * sh.out / s / 1e9, 100.0 * gbs / bwn.gb_per_s);
      std::fflush(stdout);
    };
    for (const auto [d, a8] : dtypes) {
      // int8: the weights and their bf16 scales (int8 x int8: and the sums of q).
      const double bytes = static_cast<double>(sh.out) * sh.in *
                           (d == DType::kI8 ? 1.0 + (a8 ? 4.0 : 2.0) / group : DTypeSize(d));
      const int copies = static_cast<int>(
          std::max<int64_t>(1, absl::GetFlag(FLAGS_cache_bytes) / static_cast<int64_t>(bytes)));
      std::vector<cpu::PackedMatrix> m;
      for (int c = 0; c < copies; ++c) {
        m.push_back(d == DType::kI8
                        ? cpu::PackedMatrix::QuantizeInt8(
                              {{w.data(), DType::kF32, sh.out, false, sh.in}}, sh.in, {group, a8})
                        : cpu::PackedMatrix::FromRows(w.data(), DType::kF32, sh.out, sh.in, d));
      }
      for (cpu::Isa isa : isas) {
        for (int r : rows) {
          const double s =
              on_team ? TimeBestOnTeam(threads, copies,
                                       [&](cpu::Team& team, int c) {
                                         cpu::MatMul(team, x.data(), sh.in, r, m[c], nullptr,
                                                     y.data(), sh.out, isa, &scratch);
                                       })
                      : TimeBest(copies, [&](int c) {
                          cpu::MatMul(x.data(), sh.in, r, m[c], nullptr, y.data(), sh.out, isa);
                        });
          report(a8 ? "int8a8" : ComputeDTypeName(d), cpu::IsaName(isa), r, s, bytes);
        }
      }
      if (d == DType::kF32 && absl::GetFlag(FLAGS_blas)) {
        std::vector<std::vector<float>> wc(copies, w);
        for (int r : rows) {
          const double s = TimeBest(copies, [&](int c) {
            if (r == 1) {
              cblas_sgemv(CblasRowMajor, CblasNoTrans, sh.out, sh.in, 1.0f, wc[c].data(), sh.in,
                          x.data(), 1, 0.0f, y.data(), 1);
            } else {
              cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r, sh.out, sh.in, 1.0f,
                          x.data(), sh.in, wc[c].data(), sh.in, 0.0f, y.data(), sh.out);
            }
          });
          report("float32", "openblas", r, s, bytes);
        }
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace dcf

int main(int argc, char** argv) {
  std::vector<std::string> arg_storage;
  const std::vector<char*> rest = dcf::ParseToolCommandLine(
      argc, argv,
      "times the CPU matmul kernels on a model's weight shapes\n"
      "  dcformer-matmul-bench [--dim E] [--ffn F] [--rows 1,8,32] [--dtypes f32,f16,bf16] ...",
      arg_storage);
  if (rest.size() > 1) {
    std::fprintf(stderr,
                 "dcformer-matmul-bench: unexpected argument '%s' (--help lists the flags)\n",
                 rest[1]);
    return 2;
  }
  return dcf::Main();
}
