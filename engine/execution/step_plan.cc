#include "engine/execution/step_plan.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/kv/kv_layout.h"

namespace dcf {

absl::Status ValidateStepLimits(const StepLimits& limits) {
  if (limits.max_tokens <= 0 || limits.max_seqs <= 0 || limits.blocks_per_seq <= 0 ||
      limits.num_penalty_slots < 0 || limits.max_logit_rows < 0 || limits.max_draft_rows < 0) {
    return absl::InvalidArgumentError("step limits must be positive");
  }
  return absl::OkStatus();
}

int MaxLogitRows(const StepLimits& limits) {
  return static_cast<int>(std::min<int64_t>(
      limits.max_tokens,
      int64_t{limits.max_logit_rows} + limits.max_seqs + limits.max_draft_rows));
}

absl::Status ValidateCacheShape(const KvCacheShape& shape, const ModelConfig& config) {
  if (shape.block_size <= 0 || shape.num_blocks[0] < 0 || shape.num_blocks[1] < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache shape: block size ", shape.block_size, " and block counts ",
        shape.num_blocks[0], ", ", shape.num_blocks[1], " must be positive"));
  }
  if (config.NumLayersIn(LayerGroup::kWindow) > 0 && shape.window != config.window_size) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache shape: window ", shape.window,
                                                   " differs from the model's window_size ",
                                                   config.window_size));
  }
  return absl::OkStatus();
}

size_t KvBytesPerBlock(const ModelConfig& config, LayerGroup g, int block_size,
                       size_t elem_bytes) {
  return elem_bytes * static_cast<size_t>(config.NumLayersIn(g)) *
         static_cast<size_t>(block_size) * static_cast<size_t>(KvRowLayout(config).row_floats());
}

int64_t FusedInputWidth(const ModelConfig& c) {
  constexpr int64_t C = ModelConfig::kComposeBranches;
  return 3 * int64_t{c.dim} + C * int64_t{c.dynamic_hidden()} + C * int64_t{c.n_head};
}

void RopeAngles(int64_t pos, int rotary_dim, double base, float* cos_out, float* sin_out) {
  const int half = rotary_dim / 2;
  for (int j = 0; j < half; ++j) {
    const double angle = static_cast<double>(pos) * std::pow(base, -2.0 * j / rotary_dim);
    cos_out[j] = static_cast<float>(std::cos(angle));
    sin_out[j] = static_cast<float>(std::sin(angle));
  }
}

LogitRows PlanLogitRows(const StepBatch& batch) {
  const int S = batch.num_seqs();
  LogitRows plan;
  plan.sample_row.assign(S, -1);
  for (int s = 0; s < S; ++s) {
    if (!batch.return_logits[s]) continue;
    for (int t = batch.seq_offsets[s]; t < batch.seq_offsets[s + 1]; ++t) plan.rows.push_back(t);
    // Its first sampled row among its last ones.
    plan.sample_row[s] = static_cast<int32_t>(plan.rows.size()) - batch.num_slots(s);
  }
  plan.num_returned = static_cast<int>(plan.rows.size());
  for (int s = 0; s < S; ++s) {
    if (!batch.sample[s]) continue;
    if (!batch.return_logits[s]) {
      plan.sample_row[s] = static_cast<int32_t>(plan.rows.size());
      for (int t = batch.seq_offsets[s + 1] - batch.sample_rows[s]; t < batch.seq_offsets[s + 1];
           ++t) {
        plan.rows.push_back(t);
      }
    }
    plan.sampled_seqs.push_back(s);
  }
  return plan;
}

int AcceptedDrafts(const StepBatch& batch, int s, const StepOutput& out, int first_slot) {
  const int drafts = batch.sample_rows[s] - 1;
  const int32_t* draft = batch.tokens.data() + batch.seq_offsets[s + 1] - drafts;  // [drafts]
  int a = 0;
  while (a < drafts && out.tokens[first_slot + a] == draft[a]) ++a;
  return a;
}

std::vector<int32_t> ChainableSlots(const StepBatch& batch) {
  const int S = batch.num_seqs();
  std::vector<int32_t> chainable;
  chainable.reserve(S);
  int row = 0;  // sampled rows so far
  for (int s = 0; s < S; ++s) {
    const int n = batch.num_slots(s);
    chainable.push_back(batch.sample[s] && n == 1 ? row : -1);
    for (int j = 1; j < n; ++j) chainable.push_back(-1);
    if (batch.sample[s]) row += n;
  }
  return chainable;
}

absl::Status CheckChainedTokens(const StepBatch& batch, const std::vector<int32_t>& previous) {
  for (int s = 0; s < batch.num_seqs(); ++s) {
    if (batch.seq_len(s) != 1) continue;  // only a single token may be chained
    const int slot = ChainedSlot(batch.tokens[batch.seq_offsets[s]]);
    if (slot < 0) continue;
    if (slot >= static_cast<int>(previous.size()) || previous[slot] < 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sequence ", s, " chains slot ", slot,
          previous.empty() ? ", but no step was launched before it"
                           : ", which the previous step did not sample as one sequence's row"));
    }
  }
  return absl::OkStatus();
}

void StoreSample(const SamplingRow& row, int s, int32_t token, float logprob,
                 const int32_t* top_tokens, const float* top_logprobs, int num_top,
                 StepOutput* out) {
  if (token < 0) {  // the sampler's answer to logits that are not all finite
    out->tokens[s] = -1;
    out->nonfinite[s] = 1;
    return;
  }
  out->tokens[s] = token;
  if (row.logprob || row.top_logprobs > 0) out->logprobs[s] = logprob;
  const int n = std::min(row.top_logprobs, num_top);
  for (int k = 0; k < n; ++k) {
    out->top_tokens[static_cast<size_t>(s) * kMaxTopLogprobs + k] = top_tokens[k];
    out->top_logprobs[static_cast<size_t>(s) * kMaxTopLogprobs + k] = top_logprobs[k];
  }
}

}  // namespace dcf
