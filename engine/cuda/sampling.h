// The device sampler: one token per sampled row (a sequence's last row, or each row of a
// verify chunk) from its row of logits, with exactly the pipeline of the host reference
// (engine/sampling/token_sampler.h), plus logprobs.
//
// Per row (one thread block):
//   0. a row whose raw logits hold a NaN or an infinity draws nothing: token -1, as the host
//      sampler returns (the engine then ends that request with an error);
//   1. penalties from the row's slot (repetition over seen ids, presence/frequency over
//      generated counts) plus, for row j of a verifying sequence, the j drafted tokens
//      before it, then temperature == 0 (the backend sends 0 for every temperature below
//      1e-5, SamplingParams::Greedy): argmax, lowest id on ties;
//   2. otherwise l / T, then top-k, top-p, min-p and one Philox draw u = Uniform(seed, step)
//      (engine/sampling/philox.h, the same function the host calls), inverse CDF over the
//      kept ids in descending probability order (ties: lower id first).
//   The order is never materialised: top-k, top-p and the draw are each a radix search over
//   the 32-bit order-preserving key of the logits (4 passes of 8-bit digits, per-digit
//   counts or probability mass in shared memory), which finds the boundary element of a
//   prefix of the sorted order by its rank or by its cumulative mass; ties at the boundary
//   are resolved by id with one ordered count.
//   3. logprobs from the RAW logits: log-softmax of the chosen id, and the top-n ids (radix
//      select of the n-th, then a sort of the n candidates).
// Verification (speculative decoding, engine/execution/step_batch.h): a sequence that
// verifies k drafted tokens has k + 1 consecutive rows, row j with draw step + j and
// penalties that count drafts [0, j) as generated. Every row is sampled at once, in its own
// block, as if the drafts before it were accepted (a row after a rejected draft is then
// sampled for nothing: the host and LaunchRecordSampled ignore it).
// Probabilities are float exp(l - max) accumulated in double (the host uses double exp): a
// choice can differ from the host's only where the draw or a top-p boundary falls within
// float rounding of a cumulative sum.
#pragma once

#include <cstdint>

#include "engine/simt/cuda_compat.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {

// Alternatives a row may ask for (dcf::kMaxTopLogprobs; checked in cuda_backend.cc).
inline constexpr int kSampleMaxTop = 20;

// One sampled sequence, as the host uploads it.
struct DeviceSamplingRow {
  int32_t logit_row = 0;         // row of the logits buffer
  int32_t penalty_slot = -1;     // -1: no penalties apply
  float temperature = 1.0f;      // 0: greedy
  float inv_temperature = 1.0f;  // 1.0f / temperature, in float as the host sampler does
  int32_t top_k = 0;             // 0: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t top_logprobs = 0;  // [0, kSampleMaxTop]
  int32_t want_logprob = 0;  // nonzero: compute the chosen token's logprob
  uint64_t seed = 0;
  uint64_t step = 0;  // the draw counter of this row (the sequence's step + draft_index)
  // Verification: this row is row draft_index of the seq_rows consecutive rows of its
  // sequence; its sequence's drafted tokens are SampleParams::tokens[drafts, drafts +
  // seq_rows - 1) (draft d is the token of row d + 1), and its penalties count the first
  // draft_index of them. A plain row: 1, 0, 0.
  int32_t seq_rows = 1;
  int32_t draft_index = 0;
  int32_t drafts = 0;
};

struct SampleResult {
  int32_t token;  // -1: the row's logits held a NaN or an infinity (nothing drawn)
  float logprob;
  int32_t top_tokens[kSampleMaxTop];  // best first; the first top_logprobs are valid
  float top_logprobs[kSampleMaxTop];
};

struct SampleParams {
  int num_rows = 0;                         // R sampled rows
  int vocab = 0;                            // V
  const float* logits = nullptr;            // [*, V] f32
  const DeviceSamplingRow* rows = nullptr;  // [R]
  const int32_t* tokens = nullptr;          // [T] the step's tokens (drafts); may be null
                                            //     when no row has draft_index > 0
  const uint8_t* seen = nullptr;            // [slots, V] id occurred in prompt or output
  const int32_t* counts = nullptr;          // [slots, V] occurrences among generated ids
  float* work = nullptr;                    // [R, V] f32 scratch (adjusted logits)
  SampleResult* results = nullptr;          // [R]
  // [R] optional: each row's token again (results[r].token), where the next step's
  // embedding reads chained tokens (engine/execution/step_batch.h); null: not written.
  int32_t* sampled = nullptr;
};

cudaError_t LaunchSample(const SampleParams& p, cudaStream_t stream);

// Records the sampled tokens in their penalty slots (seen = 1, count + 1), as
// PenaltyState::Record does on the host. Run after LaunchSample, before the next step. The
// rows of a verifying sequence are recorded in order up to and including the first whose
// token differs from its draft (the rule of AcceptedDrafts, step_plan.h), or up to the first
// that drew nothing (token -1, not recorded): the slot ends up counting exactly the accepted
// tokens, as the host sampler's slot does.
struct RecordSampledParams {
  int num_rows = 0;
  int vocab = 0;
  const DeviceSamplingRow* rows = nullptr;  // [R]
  const int32_t* tokens = nullptr;          // [T] the step's tokens (drafts); may be null
                                            //     when every row has seq_rows == 1
  const SampleResult* results = nullptr;    // [R]
  uint8_t* seen = nullptr;                  // [slots, V]
  int32_t* counts = nullptr;                // [slots, V]
};

cudaError_t LaunchRecordSampled(const RecordSampledParams& p, cudaStream_t stream);

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
