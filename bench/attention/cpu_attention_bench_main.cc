// dcformer-cpu-attention-bench: the attention layer's core alone on the CPU backend's kernels
// (issue 10, "Attention benchmark"): plain multi-head attention (compose off) against DCMHA,
// global and windowed, over sequence lengths; time per forward, tokens/s, memory, FLOP/s.
// The same report (attention_report.h: table, JSON, FLOP formula) as the CUDA driver
// dcformer-attention-bench, so the two compare line by line; bench/README.md documents it.
//
// One forward = cpu::PagedAttention on projected inputs: the fresh cache rows written into
// the paged cache, then every query attends (scores, pre-compose, softmax, post-compose,
// values). The q/k/v and dynamic-weight projections and Wo are not part of it.
//
//   dcformer-cpu-attention-bench [--mode prefill|decode] [--batch 32 --dim 512 --n-head 8]
//       [--seq-lens 128,256,512,1024,2048 --windows 0,256 --variants mha,dcmha]
//       [--warmup 10 --iters 100 | --quick] [--json-out FILE --plot-out FILE.png]
//       [--noquery-tiles] [--nofma-peak] [--kv-cache-dtype float32|bfloat16|float16]
//       [--layers 1]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "bench/attention/attention_report.h"
#include "engine/common/flag_names.h"
#include "engine/cpu/cpu_isa.h"
#include "engine/cpu/fma_throughput.h"
#include "engine/cpu/large_buffer.h"
#include "engine/cpu/paged_attention.h"
#include "engine/execution/backend_options.h"
#include "engine/model/model_config.h"
#include "engine/weights/dtype.h"

ABSL_FLAG(std::string, mode, "prefill",
          "prefill: each sequence's --seq-lens tokens from position 0 in one forward; decode: "
          "one new token per sequence after --seq-lens cached positions");
ABSL_FLAG(int, batch, 32, "sequences per forward");
ABSL_FLAG(int, dim, 512, "model dim (n_head * head_dim)");
ABSL_FLAG(int, n_head, 8, "heads");
ABSL_FLAG(std::string, seq_lens, "128,256,512,1024,2048", "comma-separated sequence lengths");
ABSL_FLAG(std::string, windows, "0,256", "comma-separated windows (0: global layer)");
ABSL_FLAG(std::string, variants, "mha,dcmha", "mha (compose off) and/or dcmha");
ABSL_FLAG(int, block_size, 16, "KV cache block size (tokens)");
ABSL_FLAG(int, warmup, 10, "untimed forwards first");
ABSL_FLAG(int, iters, 100, "timed forwards (the mean is reported)");
ABSL_FLAG(bool, quick, false, "1 warm-up and 3 timed forwards (a smoke run)");
ABSL_FLAG(bool, query_tiles, true,
          "prefill chunks attend in tiles of up to 32 queries (cpu::AttendTile); false: query by "
          "query (cpu::AttendOne, the path the tiles replaced; same bits)");
ABSL_FLAG(bool, fma_peak, true,
          "measure the fp32 FMA peak (engine/cpu/fma_throughput.h) before and after the sweep "
          "and state each row's GFLOP/s against it");
ABSL_FLAG(std::string, kv_cache_dtype, "float32",
          "dtype of the KV cache rows (and of the fresh rows, rounded as they are stored): "
          "float32, bfloat16 or float16");
ABSL_FLAG(int, layers, 1,
          "layers per forward, each with its own cache (as a decode step runs every layer "
          "once): with several, a forward reads rows the previous one did not leave in the CPU "
          "caches");
ABSL_FLAG(std::string, json_out, "", "also write the report as JSON to this file");
ABSL_FLAG(std::string, plot_out, "",
          "also draw ms per forward against sequence length to this PNG (needs gnuplot)");

namespace dcf {
namespace {

constexpr int C = ModelConfig::kComposeBranches;
constexpr int kI = ModelConfig::kRank;

struct CaseResult {
  double ms_per_forward = 0;
  int64_t bytes = 0;  // inputs, KV cache, output and scratch of the forward
  double kv_bytes_read = 0;
  int64_t query_tokens = 0;
};

// Runs one (variant, window, length) case on random inputs, over `layers` caches of `dtype`.
CaseResult RunCase(const bench::AttentionReport& report, bool decode, int window, int len,
                   bool compose, int warmup, int iters, DType dtype, int layers) {
  const int S = report.batch, N = report.n_head, hd = report.head_dim, B = report.block_size;
  const KvRowLayout layout(N, hd);
  const int row = layout.row_floats();
  const int64_t E = static_cast<int64_t>(N) * hd;
  const int new_per_seq = decode ? 1 : len;
  const int start = decode ? len : 0;
  const int end = start + new_per_seq;
  const int blocks_per_seq = (end + B - 1) / B;
  const int64_t T = static_cast<int64_t>(S) * new_per_seq;
  const size_t esize = DTypeSize(dtype);

  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  const auto fill = [&](std::vector<float>& v, float scale) {
    for (float& x : v) x = scale * u(rng);
  };
  // Elements of `dtype` at p: x rounded as the cache stores it.
  const auto store = [&](void* p, size_t i, float x) {
    if (dtype == DType::kF32) {
      static_cast<float*>(p)[i] = x;
    } else {
      static_cast<uint16_t*>(p)[i] = dtype == DType::kBF16 ? FloatToBF16(x) : FloatToHalf(x);
    }
  };
  // Sequence s owns blocks [s * blocks_per_seq, (s + 1) * blocks_per_seq) of each layer's cache.
  // Allocated as the backend allocates its cache (huge pages).
  const size_t cache_elems = static_cast<size_t>(S) * blocks_per_seq * B * row;
  cpu::LargeBuffer cache_buffer(cache_elems * esize * layers);
  char* cache = static_cast<char*>(cache_buffer.data());
  for (size_t i = 0; i < cache_elems * layers; ++i) store(cache, i, 0.5f * u(rng));  // decode
  std::vector<int32_t> tables(static_cast<size_t>(S) * blocks_per_seq);
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = static_cast<int32_t>(i);
  std::vector<cpu::PagedSequence> seqs(S);
  std::vector<int64_t> positions(T);
  std::vector<int32_t> seq_of(T);
  for (int s = 0; s < S; ++s) {
    seqs[s] = {start, new_per_seq, static_cast<int64_t>(s) * new_per_seq,
               &tables[static_cast<size_t>(s) * blocks_per_seq]};
    for (int j = 0; j < new_per_seq; ++j) {
      positions[static_cast<size_t>(s) * new_per_seq + j] = start + j;
      seq_of[static_cast<size_t>(s) * new_per_seq + j] = s;
    }
  }
  std::vector<float> q(T * E), dw(T * C * 2 * kI * N), g(T * C * N), out(T * E);
  std::vector<char> rows(static_cast<size_t>(T) * row * esize);  // fresh rows, of dtype
  for (size_t i = 0; i < static_cast<size_t>(T) * row; ++i) store(rows.data(), i, 0.5f * u(rng));
  fill(q, 0.5f);
  fill(dw, 0.3f);
  fill(g, 0.3f);

  cpu::PagedAttentionInputs in;
  in.layout = layout;
  in.window = window;
  in.compose = compose;
  in.query_tiles = absl::GetFlag(FLAGS_query_tiles);
  in.seqs = seqs.data();
  in.num_seqs = S;
  in.positions = positions.data();
  in.seq_of = seq_of.data();
  in.num_tokens = T;
  in.rows = rows.data();
  in.q = q.data();
  in.q_stride = E;
  in.dw = dw.data();
  in.g = g.data();
  in.g_stride = C * N;
  in.cache = {cache, 1, 0, B, dtype};
  const auto forward = [&] {
    for (int l = 0; l < layers; ++l) {
      in.cache.base = cache + l * cache_elems * esize;
      cpu::PagedAttention(in, out.data());
    }
  };

  for (int i = 0; i < warmup; ++i) forward();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) forward();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  CaseResult r;
  r.ms_per_forward = s * 1e3 / iters;
  r.query_tokens = T;
  const int64_t pairs =
      S * (decode ? bench::VisiblePairs(len, 1, window) : bench::VisiblePairs(0, len, window));
  // Every visible pair reads its key's row once (K and pre terms, then V and post terms).
  r.kv_bytes_read = static_cast<double>(pairs) * layers * row * esize;
  r.bytes = static_cast<int64_t>(cache_elems * esize * layers + rows.size()) +
            static_cast<int64_t>(sizeof(float)) *
                static_cast<int64_t>(q.size() + dw.size() + g.size() + out.size()) +
            static_cast<int64_t>(sizeof(int32_t) * (tables.size() + seq_of.size())) +
            static_cast<int64_t>(sizeof(int64_t) * positions.size()) +
            cpu::PagedAttentionScratchBytes(in);
  return r;
}

// ms per forward against sequence length, one line per (variant, window), log-log axes.
bool Plot(const bench::AttentionReport& report, const std::string& png) {
  const std::string data = png + ".dat";
  std::ofstream d(data);
  std::vector<std::string> titles;
  std::string key;
  for (const bench::AttentionRow& r : report.rows) {
    const std::string k =
        r.variant + (r.window > 0 ? " window " + std::to_string(r.window) : std::string(" global"));
    if (k != key) {
      if (!key.empty()) d << "\n\n";  // a new gnuplot data block
      titles.push_back(k);
      key = k;
    }
    d << r.seq_len << " " << r.ms_per_forward << "\n";
  }
  d.close();
  const std::string script = png + ".gp";
  std::ofstream g(script);
  g << "set terminal pngcairo size 900,600\nset output '" << png << "'\n"
    << "set title 'attention " << report.mode << " on " << report.backend << ": batch "
    << report.batch << ", dim " << report.dim << ", " << report.n_head << " heads'\n"
    << "set xlabel 'sequence length'\nset ylabel 'ms per forward'\n"
    << "set logscale xy\nset grid\nset key top left\nplot ";
  for (size_t i = 0; i < titles.size(); ++i) {
    g << (i ? ", " : "") << "'" << data << "' index " << i << " with linespoints title '"
      << titles[i] << "'";
  }
  g << "\n";
  g.close();
  const std::string cmd = "gnuplot '" + script + "'";
  return std::system(cmd.c_str()) == 0;
}

int Main() {
  bench::AttentionReport report;
  report.backend = "cpu";
  report.mode = absl::GetFlag(FLAGS_mode);
  report.batch = absl::GetFlag(FLAGS_batch);
  report.dim = absl::GetFlag(FLAGS_dim);
  report.n_head = absl::GetFlag(FLAGS_n_head);
  report.block_size = absl::GetFlag(FLAGS_block_size);
  report.warmup = absl::GetFlag(FLAGS_quick) ? 1 : absl::GetFlag(FLAGS_warmup);
  report.iters = absl::GetFlag(FLAGS_quick) ? 3 : absl::GetFlag(FLAGS_iters);
  const absl::StatusOr<DType> kv_dtype = ParseComputeDType(absl::GetFlag(FLAGS_kv_cache_dtype));
  const int layers = absl::GetFlag(FLAGS_layers);
  report.device = std::string(cpu::IsaName(cpu::ActiveIsa())) + ", " +
                  std::to_string(omp_get_max_threads()) + " threads";
  report.scope =
      "cpu::PagedAttention on projected inputs (q, fresh K/V/key-term rows, dynamic compose "
      "terms given): cache write + attention; no projections, no Wo";
  const auto bad = [](const char* what) {
    std::fprintf(stderr, "dcformer-cpu-attention-bench: %s\n", what);
    return 2;
  };
  if (report.mode != "prefill" && report.mode != "decode") {
    return bad("--mode must be prefill or decode");
  }
  if (report.batch < 1 || report.n_head < 1 || report.n_head > 256 || report.dim < report.n_head ||
      report.dim % report.n_head != 0) {
    return bad(
        "--batch and --n-head must be >= 1 (n-head <= 256) and --dim a multiple of "
        "--n-head");
  }
  report.head_dim = report.dim / report.n_head;
  if (report.block_size < 1 || report.warmup < 0 || report.iters < 1 || layers < 1) {
    return bad("--block-size, --iters and --layers must be >= 1, --warmup >= 0");
  }
  if (!kv_dtype.ok()) return bad("--kv-cache-dtype must be float32, bfloat16 or float16");
  report.dtype = ComputeDTypeName(*kv_dtype);
  if (layers > 1) report.scope += "; " + std::to_string(layers) + " layers, one cache each";
  absl::StatusOr<dcf::bench::AttentionSweep> sweep = dcf::bench::ParseAttentionSweep(
      absl::GetFlag(FLAGS_seq_lens), absl::GetFlag(FLAGS_windows), absl::GetFlag(FLAGS_variants));
  if (!sweep.ok()) return bad(std::string(sweep.status().message()).c_str());
  const std::vector<int>& seq_lens = sweep->seq_lens;
  const std::vector<int>& windows = sweep->windows;
  const std::vector<std::string>& variants = sweep->variants;

  const bool decode = report.mode == "decode";
  // The compute ceiling, measured in the same run (before and after the sweep: the load of a
  // shared machine moves it); rows are stated against the higher of the two.
  const bool fma_peak = absl::GetFlag(FLAGS_fma_peak);
  const auto measure_peak = [](const char* when) {
    const FmaThroughput one = MeasureFmaThroughput(1);
    const FmaThroughput all = MeasureFmaThroughput(omp_get_max_threads());
    std::printf("FMA peak %s (fp32, %s): %.1f GFLOP/s with 1 thread, %.1f GFLOP/s with %d\n", when,
                all.isa, one.gflop_per_s, all.gflop_per_s, all.threads);
    return all.gflop_per_s;
  };
  double peak = fma_peak ? measure_peak("before") : 0;
  std::printf("attention path: %s\n", absl::GetFlag(FLAGS_query_tiles)
                                          ? "query tiles (cpu::AttendTile) for prefill chunks"
                                          : "query by query (cpu::AttendOne)");
  for (int window : windows) {
    for (const std::string& variant : variants) {
      for (int len : seq_lens) {
        const CaseResult r = RunCase(report, decode, window, len, variant == "dcmha",
                                     report.warmup, report.iters, *kv_dtype, layers);
        bench::AttentionRow row;
        row.variant = variant;
        row.window = window;
        row.seq_len = len;
        row.ms_per_forward = r.ms_per_forward;
        row.peak_memory_mb = r.bytes / 1048576.0;
        const int64_t pairs =
            layers * report.batch *
            (decode ? bench::VisiblePairs(len, 1, window) : bench::VisiblePairs(0, len, window));
        bench::Finish(report, row, r.query_tokens, pairs, r.kv_bytes_read);
        report.rows.push_back(row);
        std::fprintf(stderr, "%s %s %d: %.3f ms, %.1f GFLOP/s\n", variant.c_str(),
                     window > 0 ? std::to_string(window).c_str() : "global", len,
                     row.ms_per_forward, row.tflop_per_s * 1e3);
      }
    }
  }
  if (fma_peak) {
    peak = std::max(peak, measure_peak("after"));
    for (const bench::AttentionRow& r : report.rows) {
      std::printf("%s %s %d: %.1f GFLOP/s = %.0f%% of the FMA peak (%.1f GFLOP/s)\n",
                  r.variant.c_str(), r.window > 0 ? std::to_string(r.window).c_str() : "global",
                  r.seq_len, r.tflop_per_s * 1e3, 100 * r.tflop_per_s * 1e3 / peak, peak);
    }
  }
  std::fputs(bench::FormatTable(report).c_str(), stdout);
  const std::string json_out = absl::GetFlag(FLAGS_json_out);
  if (!json_out.empty()) {
    std::ofstream f(json_out);
    f << bench::ToJson(report).dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "dcformer-cpu-attention-bench: cannot write --json-out %s\n",
                   json_out.c_str());
      return 1;
    }
  }
  const std::string plot_out = absl::GetFlag(FLAGS_plot_out);
  if (!plot_out.empty() && !Plot(report, plot_out)) {
    std::fprintf(stderr, "dcformer-cpu-attention-bench: gnuplot failed for --plot-out %s\n",
                 plot_out.c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace dcf

int main(int argc, char** argv) {
  std::vector<std::string> storage;
  dcf::ParseToolCommandLine(
      argc, argv,
      "times the CPU attention kernels alone: MHA vs DCMHA, global and windowed "
      "(bench/README.md)\n  dcformer-cpu-attention-bench [--mode prefill|decode] [--quick] ...",
      storage);
  return dcf::Main();
}
