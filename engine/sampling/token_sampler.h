// The host token sampler: the CPU backend's implementation and the reference the device
// sampler is tested against.
//
// Pipeline for one row, on a copy of the raw logits ([vocab] f32):
//   1. repetition penalty (HF/CTRL): over ids seen in prompt + output, l > 0 ? l / r : l * r
//   2. presence / frequency penalties (OpenAI): over generated ids,
//      l -= presence * (count > 0) + frequency * count
//   3. temperature < 1e-5 (0 among them; SamplingParams::Greedy): argmax (lowest id on
//      ties). Otherwise l / temperature, then
//      top-k (the k largest), softmax, top-p (smallest prefix of the sorted probabilities
//      whose mass reaches p), min-p (drop probabilities below min_p * max probability), and
//      one draw u = philox::Uniform(seed, step) from the renormalized distribution
//      (inverse CDF over the kept ids in descending probability order, ties by lower id;
//      when neither top-k nor top-p is on, the walk visits the maximum first and then the
//      other ids in ascending order, id 0 in the maximum's place: the same distribution).
// Cost O(V) whatever the parameters: top-k (beyond 64; up to it one insertion pass), the
// top-p boundary and the draw are radix searches over an order-preserving 32-bit key of the
// logits (three levels of 11, 11 and 10 bits, per-bucket counts or probability mass);
// nothing is sorted. Probabilities are double exp(l - max) (exp_shifted.h, within about an
// ulp of std::exp); cumulative sums are accumulated per bucket rather than in sorted order,
// so a choice can differ from a sequential sum only where the draw or the top-p bound falls
// within double rounding of a cumulative sum.
// Logprobs (ComputeLogprobs) are the log-softmax of the RAW logits, before any penalty or
// temperature: they describe the model, not the sampling distribution.
//
// Thread-compatible: distinct PenaltyState / SamplerScratch objects may be used concurrently.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "engine/sampling/sampling_params.h"

namespace dcf {

// What the penalties need to know about one sequence: which ids occurred in its prompt or
// output (repetition penalty) and how often each occurred in its output (presence and
// frequency penalties).
class PenaltyState {
 public:
  explicit PenaltyState(int vocab_size) : seen_(vocab_size, 0), counts_(vocab_size, 0) {}

  // Forgets everything, then records `prompt` as seen and `generated` as generated. Ids
  // outside the vocabulary are ignored.
  void Reset(absl::Span<const int32_t> prompt, absl::Span<const int32_t> generated);
  // Records one generated token.
  void Record(int32_t token);
  // Steps 1-2 of the pipeline, in place on `logits` ([vocab] f32).
  void Apply(const SamplingParams& params, absl::Span<float> logits) const;

  int32_t count(int32_t token) const { return counts_[token]; }
  bool seen(int32_t token) const { return seen_[token] != 0; }
  // The whole state, as the device sampler keeps it per slot: [vocab] each.
  const std::vector<uint8_t>& seen_flags() const { return seen_; }
  const std::vector<int32_t>& counts() const { return counts_; }

 private:
  std::vector<uint8_t> seen_;    // [vocab] id occurred in prompt or output
  std::vector<int32_t> counts_;  // [vocab] occurrences among generated tokens
};

// Reusable buffers of SampleToken (one per thread avoids reallocating every step).
struct SamplerScratch {
  std::vector<float> work;       // [vocab] adjusted logits
  std::vector<float> values;     // [<= vocab] the candidates' adjusted logits
  std::vector<int32_t> ids;      // [<= vocab] candidate ids, ascending
  std::vector<uint32_t> keys;    // [<= vocab] their order keys
  std::vector<double> probs;     // [<= vocab] their probabilities relative to the maximum
  std::vector<double> weights;   // [<= vocab] top-p weights
  std::vector<int32_t> counts;   // [2048] radix histogram (top-k)
  std::vector<double> mass;      // [2048] radix histogram (top-p, draw)
  std::vector<int32_t> bucket, next;  // [<= vocab] candidates of the current radix bucket
};

// Picks a token from `raw_logits` ([vocab] f32) for a sequence's draw number `step` of stream
// `seed`. `penalties` may be null when params.HasPenalties() is false. Does not record the
// token (the caller does, with PenaltyState::Record). Returns -1, drawing nothing, when any
// raw logit is NaN or infinite (a broken model must never yield a silent token); the device
// sampler does the same.
int32_t SampleToken(absl::Span<const float> raw_logits, const SamplingParams& params,
                    uint64_t seed, uint64_t step, const PenaltyState* penalties,
                    SamplerScratch* scratch);

// Returns the log-softmax of `raw_logits` at `token` and, when top_n > 0, fills `top` with
// the top_n most likely ids, best first, ties by lowest id (`top` may be null when top_n is
// 0).
float ComputeLogprobs(absl::Span<const float> raw_logits, int32_t token, int top_n,
                      std::vector<TopLogprob>* top);

// Index of the largest logit, lowest index on ties.
int32_t ArgMax(absl::Span<const float> logits);

}  // namespace dcf
