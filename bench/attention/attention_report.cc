#include "bench/attention/attention_report.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace dcf::bench {

int64_t VisiblePairs(int64_t first, int64_t count, int window) {
  int64_t pairs = 0;
  for (int64_t t = first; t < first + count; ++t) {
    pairs += window > 0 ? std::min<int64_t>(t + 1, window) : t + 1;
  }
  return pairs;
}

double AttentionFlops(int64_t pairs, int n_head, int head_dim, bool compose) {
  constexpr int kRank = 2;
  const double per_pair =
      4.0 * n_head * head_dim + (compose ? 2.0 * (4 * kRank + (3 + 4 * kRank)) * n_head : 0.0);
  return per_pair * static_cast<double>(pairs);
}

void Finish(const AttentionReport& report, AttentionRow& row, int64_t query_tokens, int64_t pairs,
            double kv_bytes) {
  const double s = row.ms_per_forward / 1e3;
  const double flops =
      AttentionFlops(pairs, report.n_head, report.head_dim, row.variant == "dcmha");
  row.tokens_per_s = s > 0 ? query_tokens / s : 0;
  row.gflop_per_forward = flops / 1e9;
  row.tflop_per_s = s > 0 ? flops / s / 1e12 : 0;
  row.kv_gb_per_forward = kv_bytes / 1e9;
  row.kv_gb_per_s = s > 0 ? kv_bytes / s / 1e9 : 0;
}

std::string FormatTable(const AttentionReport& r) {
  std::string out = absl::StrFormat(
      "attention %s: backend %s on %s, %s, batch %d, dim %d, %d heads x %d, block %d, "
      "%d warm-up + %d timed forwards\n",
      r.mode, r.backend, r.device, r.dtype, r.batch, r.dim, r.n_head, r.head_dim, r.block_size,
      r.warmup, r.iters);
  absl::StrAppendFormat(&out, "%-6s %7s %7s %12s %14s %10s %10s %9s %9s\n", "var", "window", "seq",
                        "ms/forward", "tokens/s", "mem MB", "GFLOP", "TFLOP/s", "KV GB/s");
  for (const AttentionRow& row : r.rows) {
    absl::StrAppendFormat(&out, "%-6s %7s %7d %12.4f %14.0f %10.1f %10.3f %9.3f %9.1f\n",
                          row.variant, row.window > 0 ? std::to_string(row.window) : "global",
                          row.seq_len, row.ms_per_forward, row.tokens_per_s, row.peak_memory_mb,
                          row.gflop_per_forward, row.tflop_per_s, row.kv_gb_per_s);
  }
  return out;
}

nlohmann::json ToJson(const AttentionReport& r) {
  nlohmann::json rows = nlohmann::json::array();
  for (const AttentionRow& row : r.rows) {
    rows.push_back({{"variant", row.variant},
                    {"window", row.window},
                    {"seq_len", row.seq_len},
                    {"ms_per_forward", row.ms_per_forward},
                    {"tokens_per_s", row.tokens_per_s},
                    {"peak_memory_mb", row.peak_memory_mb},
                    {"gflop_per_forward", row.gflop_per_forward},
                    {"tflop_per_s", row.tflop_per_s},
                    {"kv_gb_per_forward", row.kv_gb_per_forward},
                    {"kv_gb_per_s", row.kv_gb_per_s}});
  }
  return {{"benchmark", "attention"},
          {"backend", r.backend},
          {"device", r.device},
          {"dtype", r.dtype},
          {"mode", r.mode},
          {"scope", r.scope},
          {"batch", r.batch},
          {"dim", r.dim},
          {"n_head", r.n_head},
          {"head_dim", r.head_dim},
          {"block_size", r.block_size},
          {"warmup", r.warmup},
          {"iters", r.iters},
          {"flop_formula",
           "per visible (query, key) pair: 4*n_head*head_dim (q.k and p.v) + 38*n_head with "
           "compose (pre and post: 4*I rank dot products + (3 + 4*I) mixing terms per head, "
           "I = 2); softmax and the KV write not counted"},
          {"rows", rows}};
}

namespace {

absl::Status ParseInts(absl::string_view flag, absl::string_view text, int min,
                       std::vector<int>* out) {
  for (absl::string_view piece : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int v = 0;
    if (!absl::SimpleAtoi(piece, &v) || v < min) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--%s: '%s' is not an integer >= %d", flag, piece, min));
    }
    out->push_back(v);
  }
  if (out->empty()) return absl::InvalidArgumentError(absl::StrFormat("--%s is empty", flag));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<AttentionSweep> ParseAttentionSweep(absl::string_view seq_lens,
                                                   absl::string_view windows,
                                                   absl::string_view variants) {
  AttentionSweep sweep;
  if (absl::Status s = ParseInts("seq-lens", seq_lens, 1, &sweep.seq_lens); !s.ok()) return s;
  if (absl::Status s = ParseInts("windows", windows, 0, &sweep.windows); !s.ok()) return s;
  sweep.variants = absl::StrSplit(variants, ',', absl::SkipWhitespace());
  for (const std::string& v : sweep.variants) {
    if (v != "mha" && v != "dcmha") {
      return absl::InvalidArgumentError("--variants: each must be mha or dcmha");
    }
  }
  if (sweep.variants.empty()) return absl::InvalidArgumentError("--variants is empty");
  return sweep;
}

}  // namespace dcf::bench
