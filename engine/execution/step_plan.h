// The host side of a step, written once for every backend: the checks of what a backend is
// prepared with (step limits, cache shape), the bytes a cache block takes, which rows of a
// step need logits and in what order, where a sampled token and its logprobs go in the
// StepOutput, the RoPE angles and the width of the fused input projection. A backend differs
// from another only where its device does (docs/DESIGN.md, "The seam"). Pure functions,
// thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/execution/step_batch.h"
#include "engine/kv/kv_cache_manager.h"
#include "engine/model/model_config.h"

namespace dcf {

// InvalidArgument unless every size is positive (penalty slots and logit rows may be 0):
// Backend::Prepare's check.
absl::Status ValidateStepLimits(const StepLimits& limits);

// Logits rows one step can need within `limits`: every row of the return_logits sequences
// plus the last row of each other sequence, and never more than the step's tokens.
int MaxLogitRows(const StepLimits& limits);

// InvalidArgument unless the block size is positive, the block counts are not negative and,
// when the model has window layers, the window is the model's: Backend::AllocateCache's check.
absl::Status ValidateCacheShape(const KvCacheShape& shape, const ModelConfig& config);

// Bytes one KV block of group `g` takes: every layer of the group, `block_size` rows of
// KvRowLayout floats, each element `elem_bytes` wide (4 on the CPU; the compute dtype's size
// on CUDA).
size_t KvBytesPerBlock(const ModelConfig& config, LayerGroup g, int block_size, size_t elem_bytes);

// Floats per token of the fused attention input projection, q | k | v | dw1 | dd:
// 3E + C*K + C*N (the dynamic-weight projections ride along with q, k and v).
int64_t FusedInputWidth(const ModelConfig& config);

// RoPE angles of position `pos`: cos/sin of pos * base^(-2j / rotary_dim) for j in
// [0, rotary_dim / 2), computed in double and rounded to f32, so that every backend rotates
// by bit-identical values. `cos_out`, `sin_out`: [rotary_dim / 2] f32.
void RopeAngles(int64_t pos, int rotary_dim, double base, float* cos_out, float* sin_out);

// Which rows of a step the final norm and the output projection run for, by one rule: first
// every row of the return_logits sequences (in sequence order), then the last sample_rows[s]
// rows of each other sequence that samples (in sequence order). The first `num_returned`
// rows are the StepOutput's logits, so they come back as one block.
struct LogitRows {
  std::vector<int32_t> rows;         // [R] step token index of each logits row
  int num_returned = 0;              // rows of return_logits sequences (the first ones)
  // [S] index into `rows` of the first row a sequence samples from (its j-th sampled row is
  // sample_row[s] + j); -1: none
  std::vector<int32_t> sample_row;
  std::vector<int32_t> sampled_seqs; // sequences that sample, in sequence order
};
LogitRows PlanLogitRows(const StepBatch& batch);

// The verification rule (speculative decoding): how many of the drafted tokens of verifying
// sequence `s` (its last sample_rows[s] - 1 tokens) equal what was sampled at the row before
// each, counted from the first while they agree; its sampled tokens are out.tokens from
// `first_slot` (StepBatch::slot_offsets()[s]). The accepted tokens are those drafts and then
// the token sampled at slot first_slot + result (the first that differs, or the bonus token
// after all drafts). Both the backends' samplers (to stop sampling after the first
// difference) and the engine apply it. 0 for a plain sequence.
int AcceptedDrafts(const StepBatch& batch, int s, const StepOutput& out, int first_slot);

// Chained tokens (step_batch.h), the slots a next step may chain: [num_slots] of `batch`, for
// the one slot of each sequence that samples one row its index among the step's sampled rows
// (PlanLogitRows' order: the sampled sequences in order, sample_rows[s] rows each, which is
// where a device sampler puts that row's token); -1 for every other slot.
std::vector<int32_t> ChainableSlots(const StepBatch& batch);

// FailedPrecondition, naming the sequence, unless every chained token of `batch` names a slot
// that `previous` (the ChainableSlots of the previous launched step; empty when there is none)
// marks chainable. ValidateStepBatch has checked the rest.
absl::Status CheckChainedTokens(const StepBatch& batch, const std::vector<int32_t>& previous);

// Stores what output slot `s` sampled into `out` (StepOutput::Resize'd): its token, its logprob
// when `row` asks for logprobs or top logprobs, and the first min(row.top_logprobs,
// num_top) alternatives. `token` < 0 is how both samplers report logits that are not all
// finite (NaN or infinity, nothing drawn): `out` then flags the sequence in
// StepOutput::nonfinite instead.
void StoreSample(const SamplingRow& row, int s, int32_t token, float logprob,
                 const int32_t* top_tokens, const float* top_logprobs, int num_top,
                 StepOutput* out);

}  // namespace dcf
