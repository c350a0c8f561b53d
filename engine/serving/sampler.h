// Per-request token sampling: penalties, greedy / temperature, top-k, top-p, min-p, with the
// request's own seeded RNG (one draw per sampled token, never shared between requests), so
// other requests in the batch never change a request's random stream. The logits themselves
// vary at the ~1e-6 level with the batch composition (BLAS blocking), which can flip a
// sampled token where two candidates nearly tie.
//
// Pipeline for one step, on a copy of the raw logits ([vocab] f32):
//   1. repetition penalty (HF/CTRL): over tokens of prompt + output, l > 0 ? l / r : l * r
//   2. presence / frequency penalties (OpenAI): over generated tokens,
//      l -= presence * (count > 0) + frequency * count
//   3. temperature == 0: argmax (lowest id on ties). Otherwise l / temperature, then
//      top-k (the k largest), softmax, top-p (smallest prefix of the sorted probabilities
//      whose mass reaches p), min-p (drop probabilities below min_p * max probability), and
//      one draw from the renormalized distribution.
// Logprobs (ComputeLogprobs) are the log-softmax of the RAW logits, before any penalty or
// temperature: they describe the model, not the sampling distribution.
//
// Not thread-safe: one Sampler per request, used by the engine loop thread.
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/serving/request.h"

namespace dcf {

// InvalidArgument naming the field for values out of range (see SamplingParams).
absl::Status ValidateSamplingParams(const SamplingParams& params);

class Sampler {
 public:
  // `prompt` seeds the repetition-penalty set. Without params.seed, a random seed is drawn.
  Sampler(const SamplingParams& params, absl::Span<const int32_t> prompt, int vocab_size);

  // Picks the next token from `raw_logits` ([vocab] f32) and records it as generated.
  int32_t Sample(absl::Span<const float> raw_logits);

  uint64_t seed() const { return seed_; }

  // Applies steps 1-2 of the pipeline to `logits` in place (exposed for tests).
  void ApplyPenalties(absl::Span<float> logits) const;

 private:
  double NextUniform();  // [0, 1), 53 random bits

  SamplingParams params_;
  int vocab_size_;
  uint64_t seed_;
  std::mt19937_64 rng_;
  std::vector<uint8_t> seen_;     // [vocab] token occurred in prompt or output
  std::vector<int32_t> counts_;   // [vocab] occurrences among generated tokens
  std::vector<float> work_;       // [vocab] scratch logits
  std::vector<int32_t> order_;    // [vocab] scratch candidate ids
  std::vector<double> probs_;     // [vocab] scratch probabilities
  std::vector<std::pair<float, int32_t>> pairs_;  // [vocab] scratch (-logit, id) for sorting
};

// Fills out->logprob (log-softmax of raw_logits at `token`) and, when top_n > 0, out->top
// (the top_n most likely ids, best first, ties by lowest id).
void ComputeLogprobs(absl::Span<const float> raw_logits, int32_t token, int top_n,
                     TokenOutput* out);

}  // namespace dcf
