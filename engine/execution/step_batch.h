// One engine step as every backend receives it: a flat batch of sequences (structure of
// arrays, fixed-capacity block tables), and what the backend hands back.
//
// A sequence s contributes the new tokens [seq_offsets[s], seq_offsets[s + 1]) at
// consecutive positions starting at its cached length (a prefill chunk, or one decode
// token). Its KV blocks for positions it reads (cached keys) and writes (new rows) must be
// reserved in its block tables beforehand (KvCacheManager::Reserve).
//
// Window rule (DCFORMER.md section 5): a window layer of size W lets the query at t see keys
// t - W < p <= t. After the step, the sequence keeps only positions
// >= FirstKeptPosition(W, end) of a window layer (end = its new length). A backend writes
// each new row into the block its table names for that position, in every group, and
// nothing where the entry is kNoBlock: the KV manager gives a window layer blocks for the
// kept positions only, so positions of a long prefill chunk below that bound may get no
// window block (with prefix caching every position gets one, so that whole blocks can be
// reused: kv_cache_manager.h). A backend must therefore take the keys of a chunk's own new
// tokens from the step's freshly computed rows (not from the cache), and only keys before
// the chunk from the cache. Global layers write and read every position. A chunk may start
// at any position (after a prefix-cache hit, the first one starts at the hit).
//
// Outputs: sequences with `sample` get one token drawn from their last row's logits with
// their SamplingRow (the backend's sampler: host Sampler on the CPU, a device kernel on the
// GPU), plus the logprobs asked for; a row whose logits are not all finite gets no token and
// is flagged instead (StepOutput::nonfinite). Sequences with `return_logits` get the logits of all
// their rows copied to the host (tests and scoring only); nothing else crosses to the host.
//
// Verification (speculative decoding, docs/DESIGN.md "Speculative decoding"): a sequence with
// sample_rows[s] = n > 1 samples each of its last n rows. Its row j (0-based among those n)
// is sampled exactly as plain decoding would sample that position: draw counter
// sampling.step + j, and penalty state that counts the j drafted tokens before it (the
// tokens of rows 1..j of those n, i.e. draft token j is the token of row j + 1). Rows are
// sampled in order and sampling stops after the first row whose token differs from its
// draft (AcceptedDrafts, step_plan.h): later rows get token -1 and no flag, and the penalty
// slot ends up recording exactly the tokens that were accepted. Only backends whose
// Backend::VerifiesDrafts() is true accept n > 1.
//
// Chained tokens (pipelined steps, docs/DESIGN.md "Pipelined steps"): a token id
// tokens[t] = ChainedToken(j) (<= kChainedTokenBase, i.e. negative) stands for the token that
// the previous launched step sampled at its output slot j (its StepBatch::slot_offsets), which
// the host need not know yet: the backend takes it from that step's sampled output where it
// lies (on its device), so step n + 1 can be launched before step n is waited for. Only the
// one token of a sequence that samples one row may be chained (a decode whose last token the
// previous step is still sampling), no two sequences may chain the same slot, and the slot must
// be the one slot of a sequence of the previous step that sampled one row (ChainableSlots,
// step_plan.h). A chained slot whose sampler drew nothing (StepOutput::nonfinite) is read as
// token 0: the engine ends that request and drops the row. Only backends whose
// Backend::ChainsSteps() is true accept chained tokens.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/kv/kv_cache_manager.h"
#include "engine/model/model_config.h"
#include "engine/sampling/sampling_params.h"

namespace dcf {

// Chained tokens (above): ChainedToken(j) names output slot j (>= 0) of the previous launched
// step; ChainedSlot gives j back, or -1 for an ordinary id (>= 0). -1 itself is neither (it is
// what StepOutput::tokens holds where nothing was sampled).
inline constexpr int32_t kChainedTokenBase = -2;
inline constexpr int32_t ChainedToken(int slot) { return kChainedTokenBase - slot; }
inline constexpr int ChainedSlot(int32_t token) {
  return token <= kChainedTokenBase ? kChainedTokenBase - token : -1;
}

// Sampling inputs of one sequence of the step.
struct SamplingRow {
  SamplingParams params;
  uint64_t seed = 0;          // the sequence's random stream (philox.h)
  uint64_t step = 0;          // tokens it sampled before this one: the draw counter
  int32_t penalty_slot = -1;  // Backend::SetPenaltyState slot; -1: no penalties apply
  bool logprob = false;       // return the chosen token's logprob
  int32_t top_logprobs = 0;   // return this many alternatives, [0, kMaxTopLogprobs]
};

// Sizes a backend prepares its per-step workspace for (Backend::Prepare).
struct StepLimits {
  int max_tokens = 0;         // T: new tokens per step
  int max_seqs = 0;           // S: sequences per step
  int max_logit_rows = 0;     // rows whose logits the host may ask for in one step
  int blocks_per_seq = 0;     // block-table capacity: ceil(context / block_size)
  int num_penalty_slots = 0;  // sequences whose penalty state the backend keeps
  // Sampled rows beyond one per sequence (verified drafts, sample_rows - 1 summed) in one
  // step. 0: no step verifies; only a backend that VerifiesDrafts() accepts more.
  int max_draft_rows = 0;
};

struct StepBatch {
  std::vector<int32_t> tokens;       // [T] ids (or chained tokens), sequence after sequence
  std::vector<int32_t> positions;    // [T]
  std::vector<int32_t> seq_offsets;  // [S + 1], seq_offsets[0] == 0
  // Per layer group: [S, blocks_per_seq] physical block of each logical block (position
  // p lives in logical block p / B), kNoBlock where absent or beyond the table.
  int32_t blocks_per_seq = 0;
  std::array<std::vector<int32_t>, kNumLayerGroups> block_tables;
  std::vector<uint8_t> sample;         // [S] draw a token from the last row
  std::vector<SamplingRow> sampling;   // [S] used where sample[s]
  // [S] where sample[s]: how many of its last rows sample (1: plain decode or a prefill's
  // last chunk; k + 1: verifies the k drafted tokens the chunk ends with). 1 elsewhere.
  std::vector<int32_t> sample_rows;
  std::vector<uint8_t> return_logits;  // [S] copy all rows' logits to the host

  int num_seqs() const { return static_cast<int>(sample.size()); }
  int num_tokens() const { return static_cast<int>(tokens.size()); }
  int start_pos(int s) const { return positions[seq_offsets[s]]; }
  int seq_len(int s) const { return seq_offsets[s + 1] - seq_offsets[s]; }
  // Rows whose logits are returned: every token of the sequences with return_logits.
  int num_logit_rows() const;
  // Output slots of sequence s (StepOutput arrays): sample_rows[s] where it samples, else 1.
  int num_slots(int s) const { return sample[s] ? sample_rows[s] : 1; }
  // [S + 1] first output slot of each sequence; slot_offsets()[S] slots in all. With no
  // verifying sequence, slot s is sequence s.
  std::vector<int32_t> slot_offsets() const;

  // Empties the batch and sets the block-table capacity.
  void Reset(int blocks_per_seq);
  // Appends a sequence: `tokens` at positions kv.num_tokens.., its block tables copied from
  // `kv` (which must cover the new tokens), and what to return. `sample_rows` > 1 verifies
  // the last sample_rows - 1 tokens as drafts (see above).
  void AddSequence(absl::Span<const int32_t> tokens, const SequenceKv& kv, bool sample,
                   const SamplingRow& sampling, bool return_logits, int sample_rows = 1);
};

// Every per-token array has one entry per output slot (StepBatch::slot_offsets: one per
// sequence, sample_rows of a verifying one, in row order); written "[S]" below, which is
// exact when no sequence verifies.
struct StepOutput {
  std::vector<int32_t> tokens;        // [S] sampled id, -1 where not sampled (or nonfinite)
  // [S] 1 where the sequence's logits held a NaN or an infinity: its sampler drew nothing
  // (tokens[s] = -1). Not a backend failure: the engine ends that request.
  std::vector<uint8_t> nonfinite;
  std::vector<float> logprobs;        // [S] log-softmax of the raw logits at tokens[s]
  std::vector<int32_t> top_tokens;    // [S, kMaxTopLogprobs] best first; first
  std::vector<float> top_logprobs;    //   sampling[s].top_logprobs entries are valid
  std::vector<float> logits;          // [num_logit_rows, vocab] f32, sequence order

  // `num_slots`: StepBatch::slot_offsets().back() (num_seqs when no sequence verifies).
  void Resize(int num_slots, int num_logit_rows, int vocab_size);
};

// Checks a batch against the model and the cache before a backend runs it: array sizes,
// token ids (chained ones only where allowed and each slot once; whether the previous step
// sampled that slot is CheckChainedTokens' part, step_plan.h), contiguous positions within the
// context, block tables covering every position read and kept (with the window rule above)
// and naming only blocks of the pool, sampling rows (ValidateSamplingParams, penalty slots <
// `limits.num_penalty_slots`, top_logprobs) and the step limits.
// InvalidArgument / OutOfRange / FailedPrecondition with a message naming the sequence.
absl::Status ValidateStepBatch(const StepBatch& batch, const ModelConfig& config,
                               const KvCacheShape& cache, const StepLimits& limits);

}  // namespace dcf
