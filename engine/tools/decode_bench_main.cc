// dcformer-decode-bench: single-sequence (batch 1) speed of the CPU engine.
//
//   dcformer-decode-bench --model DIR [--prompt-tokens 128 --new-tokens 64 --repeats 3]
//
// Prints load time, peak RSS after loading, prefill throughput and decode tokens/s
// (median over repeats). Each repeat is one greedy run: the prompt's steps and every decode
// step are timed on their own (SequenceRunner's GreedyResult), so decode tokens/s is decode
// steps / their summed wall time, never a difference of two separately timed runs. Prompt ids
// are deterministic pseudo-random ids below vocab_size.
// With --roofline (cpu backend) it then measures, in the same run, the memory read bandwidth
// and the FMA throughput with 1 and all OpenMP threads, and prints the decode speed as a
// fraction of the memory roofline (bandwidth / weight bytes one decode step reads) and the
// prefill's matrix GFLOP/s as a fraction of the measured FMA peak.
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <random>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/time/clock.h"
#include "engine/backends/backend_factory.h"
#include "engine/backends/backend_flags.h"
#include "engine/common/flag_names.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/fma_throughput.h"
#include "engine/cpu/read_bandwidth.h"
#include "engine/serving/sequence_runner.h"

ABSL_FLAG(std::string, model, DCF_DEFAULT_MODEL_DIR, "model directory");
ABSL_FLAG(int, prompt_tokens, 128, "prompt length");
ABSL_FLAG(int, new_tokens, 64, "tokens to decode");
ABSL_FLAG(int, repeats, 3, "repetitions (median reported)");
ABSL_FLAG(int, verify_tokens, 0,
          "if > 0 (cpu backend): also time a step that verifies this many drafted tokens "
          "(speculative decoding: a chunk of 1 + k tokens sampling every row) against a plain "
          "decode step at the same position, alternating, median of 5 x --repeats each, and "
          "(cpu backend) the mean time of each phase of both");
ABSL_FLAG(bool, roofline, false,
          "measure memory read bandwidth and FMA throughput in the same run and compare decode "
          "with the memory roofline and prefill with the FMA peak (cpu backend)");

namespace {

double PeakRssMiB() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss / 1024.0;  // KiB on Linux
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> storage;
  std::vector<char*> rest = dcf::ParseToolCommandLine(
      argc, argv,
      "batch-1 speed of the engine: load time, peak RSS, prefill and decode tokens/s\n"
      "  dcformer-decode-bench --model DIR [--prompt-tokens 128 --new-tokens 64 --repeats 3] "
      "[--roofline]",
      storage);
  if (rest.size() > 1) {
    std::fprintf(stderr, "dcformer-decode-bench: unexpected argument '%s'\n", rest[1]);
    return 2;
  }
  if (absl::GetFlag(FLAGS_repeats) < 1 || absl::GetFlag(FLAGS_prompt_tokens) < 1 ||
      absl::GetFlag(FLAGS_new_tokens) < 1) {
    std::fprintf(stderr, "dcformer-decode-bench: --repeats, --prompt-tokens and --new-tokens "
                         "must be >= 1\n");
    return 2;
  }
  auto backend_options = dcf::BackendOptionsFromFlags();
  if (!backend_options.ok()) {
    std::fprintf(stderr, "dcformer-decode-bench: %s\n",
                 std::string(backend_options.status().message()).c_str());
    return 2;
  }
  const absl::Time t0 = absl::Now();
  auto model = dcf::LoadModel(absl::GetFlag(FLAGS_model), *backend_options);
  if (!model.ok()) {
    std::fprintf(stderr, "dcformer-decode-bench: %s\n", model.status().ToString().c_str());
    return 1;
  }
  const double load_s = absl::ToDoubleSeconds(absl::Now() - t0);
  const double rss_after_load = PeakRssMiB();
  const dcf::ModelConfig& c = model->config;
  if (c.max_positions < 3) {
    std::fprintf(stderr, "dcformer-decode-bench: the model context is too short\n");
    return 1;
  }
  const int prompt_len = std::min(absl::GetFlag(FLAGS_prompt_tokens), c.max_positions / 2);
  const int new_tokens =
      std::min(absl::GetFlag(FLAGS_new_tokens), c.max_positions - prompt_len - 1);
  std::mt19937 rng(1234);
  std::vector<int32_t> prompt(prompt_len);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % c.vocab_size);

  auto fail = [](const absl::Status& st) {
    std::fprintf(stderr, "dcformer-decode-bench: %s\n", st.ToString().c_str());
    return 1;
  };
  auto runner = dcf::SequenceRunner::Create(model->backend.get(), /*block_size=*/16,
                                            absl::GetFlag(FLAGS_verify_tokens));
  if (!runner.ok()) return fail(runner.status());
  std::vector<double> prefill_tps, decode_tps;
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
    (*runner)->Reset();
    // The prompt's steps sample the first token; each of the new_tokens decode steps after
    // it is timed around its own step (no EOS: the run always takes them all).
    auto res = (*runner)->Greedy(prompt, new_tokens + 1, 512);
    if (!res.ok()) return fail(res.status());
    double decode_s = 0;
    for (double s : res->decode_step_seconds) decode_s += s;
    const int steps = static_cast<int>(res->decode_step_seconds.size());
    if (steps == 0 || decode_s <= 0 || res->prompt_seconds <= 0) {
      return fail(absl::InternalError("the greedy run timed no decode step"));
    }
    prefill_tps.push_back(prompt_len / res->prompt_seconds);
    decode_tps.push_back(steps / decode_s);
  }
  std::sort(prefill_tps.begin(), prefill_tps.end());
  std::sort(decode_tps.begin(), decode_tps.end());
  std::printf("model: %s (%s, E=%d, layers=%d, heads=%d, ffn=%d, vocab=%d)\n",
              absl::GetFlag(FLAGS_model).c_str(), c.ArchitectureName().c_str(), c.dim, c.n_layer,
              c.n_head, c.intermediate_size, c.vocab_size);
  const dcf::BackendInfo info = model->backend->info();
  std::printf("backend: %s on %s, %s\n", info.name.c_str(), info.device.c_str(),
              dcf::WeightsName(info).c_str());
  std::printf("load: %.2f s, peak RSS after load: %.1f MiB\n", load_s, rss_after_load);
  std::printf("prefill: %d tokens, %.1f tokens/s (median of %zu)\n", prompt_len,
              prefill_tps[prefill_tps.size() / 2], prefill_tps.size());
  const double decode = decode_tps[decode_tps.size() / 2];
  std::printf("decode batch 1: %d tokens after a %d-token prompt, %.2f tokens/s (median)\n",
              new_tokens, prompt_len, decode);
  const int verify = absl::GetFlag(FLAGS_verify_tokens);
  if (verify > 0 && model->backend->VerifiesDrafts()) {
    // The sequence holds prompt + verify + 1 tokens; the timed steps rewrite the rows from
    // position prompt_len on, so that both kinds of step run at the same position. The prompt
    // stays below a window layer's window (nothing freed).
    std::vector<int32_t> tokens = prompt;
    for (int i = 0; i <= verify; ++i) tokens.push_back(static_cast<int32_t>(rng() % c.vocab_size));
    (*runner)->Reset();
    if (absl::Status st = (*runner)->Append(tokens, 512); !st.ok()) return fail(st);
    dcf::SequenceKv kv = (*runner)->kv();
    kv.num_tokens = prompt_len;
    dcf::SamplingRow row;
    row.params.temperature = 0;
    row.logprob = true;
    dcf::StepBatch batch;
    dcf::StepOutput out;
    std::vector<double> plain_ms, verify_ms;
    // The CPU backend's phases (cpu_profile.h) summed over each kind of step: where the
    // verify step's extra time goes.
    const auto* profiled = dynamic_cast<const dcf::CpuBackend*>(model->backend.get());
    std::array<double, dcf::cpu::CpuStepProfile::kNumPhases> plain_phases{}, verify_phases{};
    const int blocks_per_seq = (c.max_positions + 15) / 16;  // SequenceRunner's block size
    for (int r = 0; r < 5 * absl::GetFlag(FLAGS_repeats); ++r) {
      for (int n : {1, verify + 1}) {
        batch.Reset(blocks_per_seq);
        batch.AddSequence(absl::MakeConstSpan(tokens).subspan(prompt_len, n), kv, true, row,
                          false, n);
        dcf::cpu::CpuStepProfile before;
        if (profiled != nullptr) before = profiled->profile();
        const absl::Time s0 = absl::Now();
        if (absl::Status st = model->backend->Step(batch, &out); !st.ok()) return fail(st);
        (n == 1 ? plain_ms : verify_ms).push_back(1e3 * absl::ToDoubleSeconds(absl::Now() - s0));
        if (profiled != nullptr) {
          for (int i = 0; i < dcf::cpu::CpuStepProfile::kNumPhases; ++i) {
            (n == 1 ? plain_phases : verify_phases)[i] +=
                profiled->profile().seconds[i] - before.seconds[i];
          }
        }
      }
    }
    std::sort(plain_ms.begin(), plain_ms.end());
    std::sort(verify_ms.begin(), verify_ms.end());
    const double p = plain_ms[plain_ms.size() / 2], v = verify_ms[verify_ms.size() / 2];
    std::printf("verify step: %d drafted tokens at position %d: %.2f ms, plain decode step "
                "%.2f ms: %.2fx (medians of %zu, alternating; greedy, random drafts)\n",
                verify, prompt_len, v, p, v / p, plain_ms.size());
    if (profiled != nullptr) {
      std::printf("  phases, mean ms per step, plain -> verify:");
      for (int i = 0; i < dcf::cpu::CpuStepProfile::kNumPhases; ++i) {
        const double steps = static_cast<double>(plain_ms.size());
        std::printf(" %s %.2f -> %.2f;", dcf::cpu::CpuStepProfile::Name(i),
                    1e3 * plain_phases[i] / steps, 1e3 * verify_phases[i] / steps);
      }
      std::printf("\n");
    }
  }
  const auto* cpu = dynamic_cast<const dcf::CpuBackend*>(model->backend.get());
  if (absl::GetFlag(FLAGS_roofline) && cpu != nullptr) {
    const double bytes = static_cast<double>(cpu->WeightBytesPerStep());
    const dcf::ReadBandwidth one = dcf::MeasureReadBandwidth(1);
    const dcf::ReadBandwidth all = dcf::MeasureReadBandwidth(omp_get_max_threads());
    std::printf("read bandwidth (1 GiB, %s): %.1f GB/s with 1 thread, %.1f GB/s with %d\n",
                all.avx512 ? "AVX-512" : "portable", one.gb_per_s, all.gb_per_s, all.threads);
    const double roof = all.gb_per_s * 1e9 / bytes;
    std::printf("weights read per decode step: %.3f GB (%s) -> roofline %.1f tokens/s; "
                "decode at %.0f%% of it\n",
                bytes / 1e9, dcf::WeightsName(info).c_str(), roof, 100.0 * decode / roof);
    const dcf::FmaThroughput fma_one = dcf::MeasureFmaThroughput(1);
    const dcf::FmaThroughput fma_all = dcf::MeasureFmaThroughput(omp_get_max_threads());
    std::printf("FMA peak (fp32, %s): %.1f GFLOP/s with 1 thread, %.1f GFLOP/s with %d\n",
                fma_all.isa, fma_one.gflop_per_s, fma_all.gflop_per_s, fma_all.threads);
    const double prefill_gflops =
        cpu->MatMulFlopsPerToken() * prefill_tps[prefill_tps.size() / 2] / 1e9;
    std::printf("prefill matrix products: %.1f GFLOP/s (2 x layer matrix elements per token, "
                "attention not counted) = %.0f%% of the FMA peak\n",
                prefill_gflops,
                fma_all.gflop_per_s > 0 ? 100.0 * prefill_gflops / fma_all.gflop_per_s : 0.0);
  }
  return 0;
}
