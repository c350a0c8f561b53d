// The attention benchmark's report (issue 10, "Attention benchmark"), shared by every backend's
// driver so their tables and JSON files compare line by line: one row per (variant, window,
// sequence length), the time per forward, tokens/s, memory and FLOP/s with one FLOP formula.
// bench/attention/README.md documents the fields.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace dcf::bench {

struct AttentionRow {
  std::string variant;  // "mha" (compose off) or "dcmha"
  int window = 0;       // 0: global layer
  int seq_len = 0;      // prefill: tokens per sequence; decode: cached keys before the token
  double ms_per_forward = 0;
  double tokens_per_s = 0;       // query tokens per second
  double peak_memory_mb = 0;     // memory the forward holds (see README.md)
  double gflop_per_forward = 0;  // AttentionFlops / 1e9
  double tflop_per_s = 0;
  double kv_gb_per_forward = 0;  // bytes of cache rows the kernels read (decode), / 1e9
  double kv_gb_per_s = 0;
};

struct AttentionReport {
  std::string backend;  // "cuda", "cuda-sim", "cpu"
  std::string device;
  std::string dtype;  // cache / output dtype of the forward
  std::string mode;   // "prefill": every sequence's seq_len tokens from position 0;
                      // "decode": one new token per sequence after seq_len cached ones
  std::string scope;  // what one forward includes
  int batch = 0;
  int dim = 0;
  int n_head = 0;
  int head_dim = 0;
  int block_size = 0;
  int warmup = 0;
  int iters = 0;
  std::vector<AttentionRow> rows;
};

// Query-key pairs one sequence computes: queries at positions [first, first + count) each see
// keys p with max(0, t - W + 1) <= p <= t (W = 0: all earlier keys).
int64_t VisiblePairs(int64_t first, int64_t count, int window);

// FLOPs of one forward, as stated in README.md: per visible (query, key) pair 4 N hd (q.k and
// p.v, a multiply-add = 2 FLOPs) plus, with compose, 38 N (pre- and post-compose: the 4 I
// rank dot products and the 3 + 4 I mixing terms per head, I = 2, each twice). Softmax and
// the KV write are not counted.
double AttentionFlops(int64_t pairs_per_batch, int n_head, int head_dim, bool compose);

// Fills the derived fields of `row` (tokens/s, GFLOP, TFLOP/s, GB/s) from ms_per_forward.
void Finish(const AttentionReport& report, AttentionRow& row, int64_t query_tokens, int64_t pairs,
            double kv_bytes);

std::string FormatTable(const AttentionReport& report);
nlohmann::json ToJson(const AttentionReport& report);

// The sweep every driver runs, from its --seq-lens, --windows and --variants flags: each a
// non-empty comma-separated list; lengths are integers >= 1, windows >= 0 (0: a global
// layer), variants "mha" (compose off) or "dcmha". InvalidArgument naming the flag otherwise.
struct AttentionSweep {
  std::vector<int> seq_lens;
  std::vector<int> windows;
  std::vector<std::string> variants;
};
absl::StatusOr<AttentionSweep> ParseAttentionSweep(absl::string_view seq_lens,
                                                   absl::string_view windows,
                                                   absl::string_view variants);

}  // namespace dcf::bench
