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

// temperature == 0 selects greedy decoding (argmax; ties -> lowest id) and ignores the
// other sampling fields except the penalties.
struct SamplingParams {
  float temperature = 1.0f;         // >= 0, finite
  int32_t top_k = 0;                // 0 = off; else >= 1
  float top_p = 1.0f;               // (0, 1]
  float min_p = 0.0f;               // [0, 1]
  float repetition_penalty = 1.0f;  // > 0; 1 = off (HF/CTRL style, over prompt + output)
  float presence_penalty = 0.0f;    // [-2, 2] (OpenAI style, over generated tokens)
  float frequency_penalty = 0.0f;   // [-2, 2]
  std::optional<uint64_t> seed;     // fixes this request's random stream (see philox.h)

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
