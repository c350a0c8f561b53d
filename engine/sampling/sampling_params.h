// How one request's tokens are chosen: the parameters, their limits, and the constants every
// backend's sampler shares. Plain data, transport-free.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/status.h"

namespace dcf {

// The most alternatives a request may ask for per token (OutputOptions::top_logprobs); also
// the fixed capacity of the per-row top-logprob arrays a backend returns.
inline constexpr int kMaxTopLogprobs = 20;

// Temperatures below this are greedy, as 0 is (the rule vLLM has too): as T -> 0 the
// distribution softmax(l / T) tends to the argmax, while 1 / T itself overflows a float
// below T ~ 3e-39, and l / T does for |l| >= 3.4 at T = 1e-38, which made the draw walk
// infinities and NaNs (random tokens, or an end of text at once).
inline constexpr float kGreedyBelowTemperature = 1e-5f;

// temperature < kGreedyBelowTemperature (0 among them) selects greedy decoding (argmax; ties
// -> lowest id) and ignores the other sampling fields except the penalties.
struct SamplingParams {
  float temperature = 1.0f;         // >= 0, finite; below 1e-5 greedy
  int32_t top_k = 0;                // 0 = off; else >= 1
  float top_p = 1.0f;               // (0, 1]
  float min_p = 0.0f;               // [0, 1]
  float repetition_penalty = 1.0f;  // > 0; 1 = off (HF/CTRL style, over prompt + output)
  float presence_penalty = 0.0f;    // [-2, 2] (OpenAI style, over generated tokens)
  float frequency_penalty = 0.0f;   // [-2, 2]
  std::optional<uint64_t> seed;     // fixes this request's random stream (see philox.h)

  // Argmax decoding (kGreedyBelowTemperature): every backend's sampler asks this.
  bool Greedy() const { return temperature < kGreedyBelowTemperature; }

  // True when any penalty changes the logits (the sampler then needs the sequence's token
  // counts).
  bool HasPenalties() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
};

// InvalidArgument naming the field ("sampling.<field> ...") for values out of range.
absl::Status ValidateSamplingParams(const SamplingParams& params);

struct TopLogprob {
  int32_t token = 0;
  float logprob = 0;
};

}  // namespace dcf
