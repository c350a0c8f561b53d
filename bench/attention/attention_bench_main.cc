// dcformer-attention-bench: the attention layer's core alone on the CUDA kernels (issue 10,
// "Attention benchmark"): MHA (compose off) against DCMHA, global and windowed, over
// sequence lengths; average time per forward, tokens/s, memory and FLOP/s. README.md beside
// this file documents the table, the JSON and the FLOP formula.
//
//   dcformer-attention-bench [--backend cuda|cuda-sim] [--mode prefill|decode]
//       [--batch 32 --dim 512 --n-head 8 --seq-lens 128,256,512,1024,2048 --windows 0,256]
//       [--variants mha,dcmha --dtype bfloat16 --warmup 10 --iters 100 --json-out FILE]
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "bench/attention/attention_report.h"
#include "engine/common/flag_names.h"
#include "engine/cuda/dcmha_bench.h"

ABSL_FLAG(std::string, backend, DCF_ATTENTION_BENCH_DEFAULT_BACKEND,
          "cuda (a GPU) or cuda-sim (the same kernels on the SIMT emulator: tiny cases only)");
ABSL_FLAG(std::string, mode, "prefill",
          "prefill: each sequence's --seq-lens tokens from position 0 in one forward; decode: "
          "one new token per sequence after --seq-lens cached positions");
ABSL_FLAG(int, batch, 32, "sequences per forward");
ABSL_FLAG(int, dim, 512, "model dim (n_head * head_dim)");
ABSL_FLAG(int, n_head, 8, "heads");
ABSL_FLAG(std::string, seq_lens, "128,256,512,1024,2048", "comma-separated sequence lengths");
ABSL_FLAG(std::string, windows, "0,256", "comma-separated windows (0: global layer)");
ABSL_FLAG(std::string, variants, "mha,dcmha", "mha (compose off) and/or dcmha");
ABSL_FLAG(std::string, dtype, "bfloat16", "KV cache and output dtype: float32, bfloat16, float16");
ABSL_FLAG(int, block_size, 16, "KV cache block size (tokens)");
ABSL_FLAG(int, warmup, 10, "untimed forwards first");
ABSL_FLAG(int, iters, 100, "timed forwards (the mean is reported)");
ABSL_FLAG(std::string, json_out, "", "also write the report as JSON to this file");

namespace {

int Main() {
  dcf::bench::AttentionReport report;
  report.backend = absl::GetFlag(FLAGS_backend);
  report.mode = absl::GetFlag(FLAGS_mode);
  report.batch = absl::GetFlag(FLAGS_batch);
  report.dim = absl::GetFlag(FLAGS_dim);
  report.n_head = absl::GetFlag(FLAGS_n_head);
  report.block_size = absl::GetFlag(FLAGS_block_size);
  report.warmup = absl::GetFlag(FLAGS_warmup);
  report.iters = absl::GetFlag(FLAGS_iters);
  report.dtype = absl::GetFlag(FLAGS_dtype);
  report.scope =
      "LaunchKvCacheWrite + LaunchDcmha on projected inputs (q, k, v, dynamic compose terms "
      "given); no projections, no Wo";
  auto bad = [](const char* what) {
    std::fprintf(stderr, "dcformer-attention-bench: %s\n", what);
    return 2;
  };
  if (report.backend != "cuda" && report.backend != "cuda-sim") {
    return bad("--backend must be cuda or cuda-sim");
  }
#if !defined(DCF_ATTENTION_BENCH_HAS_GPU)
  if (report.backend == "cuda") return bad("--backend cuda: this build has no CUDA toolkit");
#endif
  if (report.mode != "prefill" && report.mode != "decode") {
    return bad("--mode must be prefill or decode");
  }
  if (report.batch < 1 || report.n_head < 1 || report.dim < report.n_head ||
      report.dim % report.n_head != 0) {
    return bad("--batch and --n-head must be >= 1 and --dim a multiple of --n-head");
  }
  report.head_dim = report.dim / report.n_head;
  int dtype = -1;
  if (report.dtype == "float32") dtype = 0;
  if (report.dtype == "bfloat16") dtype = 1;
  if (report.dtype == "float16") dtype = 2;
  if (dtype < 0) return bad("--dtype must be float32, bfloat16 or float16");
  if (report.block_size < 1 || report.warmup < 0 || report.iters < 1) {
    return bad("--block-size and --iters must be >= 1, --warmup >= 0");
  }
  absl::StatusOr<dcf::bench::AttentionSweep> sweep = dcf::bench::ParseAttentionSweep(
      absl::GetFlag(FLAGS_seq_lens), absl::GetFlag(FLAGS_windows), absl::GetFlag(FLAGS_variants));
  if (!sweep.ok()) return bad(std::string(sweep.status().message()).c_str());
  const std::vector<int>& seq_lens = sweep->seq_lens;
  const std::vector<int>& windows = sweep->windows;
  const std::vector<std::string>& variants = sweep->variants;

  const bool decode = report.mode == "decode";
  for (int window : windows) {
    for (const std::string& variant : variants) {
      for (int len : seq_lens) {
        dcf::cuda_bench::AttentionBenchCase c;
        c.batch = report.batch;
        c.n_head = report.n_head;
        c.head_dim = report.head_dim;
        c.seq_len = len;
        c.decode = decode;
        c.window = window;
        c.compose = variant == "dcmha";
        c.dtype = dtype;
        c.block_size = report.block_size;
        c.warmup = report.warmup;
        c.iters = report.iters;
        dcf::cuda_bench::AttentionBenchResult r;
        std::string error;
#if defined(DCF_ATTENTION_BENCH_HAS_GPU)
        if (report.backend == "cuda") error = dcf::cuda_bench::gpu::RunAttentionBench(c, &r);
#endif
        if (report.backend == "cuda-sim") error = dcf::cuda_bench::sim::RunAttentionBench(c, &r);
        if (!error.empty()) {
          std::fprintf(stderr, "dcformer-attention-bench: %s %s window %d length %d: %s\n",
                       report.backend.c_str(), variant.c_str(), window, len, error.c_str());
          return 1;
        }
        report.device = r.device;
        dcf::bench::AttentionRow row;
        row.variant = variant;
        row.window = window;
        row.seq_len = len;
        row.ms_per_forward = r.ms_per_forward;
        row.peak_memory_mb = r.device_bytes / 1048576.0;
        const int64_t pairs = report.batch * (decode ? dcf::bench::VisiblePairs(len, 1, window)
                                                     : dcf::bench::VisiblePairs(0, len, window));
        dcf::bench::Finish(report, row, r.query_tokens, pairs, r.kv_bytes_read);
        report.rows.push_back(row);
        std::fflush(stdout);
      }
    }
  }
  std::fputs(dcf::bench::FormatTable(report).c_str(), stdout);
  const std::string json_out = absl::GetFlag(FLAGS_json_out);
  if (!json_out.empty()) {
    std::ofstream f(json_out);
    f << dcf::bench::ToJson(report).dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "dcformer-attention-bench: cannot write --json-out %s\n",
                   json_out.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> storage;
  dcf::ParseToolCommandLine(
      argc, argv,
      "times the CUDA attention kernels alone: MHA vs DCMHA, global and windowed "
      "(bench/attention/README.md)\n  dcformer-attention-bench [--backend cuda|cuda-sim] ...",
      storage);
  return Main();
}
