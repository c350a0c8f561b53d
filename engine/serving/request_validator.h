// The one validator of a GenerationRequest: every rule about request values lives here, and
// the server, the tools and the benchmarks rely on it (the server only converts its proto
// messages and maps the Status). Pure functions, thread-safe.
//
// Messages start with the field path of the GenerationRequest (its `id` is the API's
// "request_id"), e.g.
//   "sampling.top_p: must be in (0, 1], got 0"
//   "prompt_tokens[3]: token id 999 is outside the model vocabulary [0, 300)"
//   "request_id: must be at most 128 bytes, got 129"
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/serving/request.h"

namespace dcf {

// Bounds on what one request may carry, whatever the model: they keep the per-token work of
// the stop checks and the size of what is logged small.
inline constexpr int kMaxRequestIdBytes = 128;
inline constexpr int kMaxStopStrings = 16;
inline constexpr int kMaxStopStringBytes = 256;
inline constexpr int kMaxStopTokenIds = 64;

struct RequestLimits {
  int vocab_size = 0;            // model vocabulary: prompt / stop / eos ids must be below it
  int context = 0;               // model context (max positions)
  int max_prompt_tokens = 0;     // resolved (never 0)
  int max_new_tokens_limit = 0;  // resolved (never 0)
  bool has_tokenizer = false;
};

// InvalidArgument (message names the field) for malformed values; OutOfRange when the prompt
// or max_new_tokens exceed the limits or their sum exceeds the context.
absl::Status ValidateRequest(const GenerationRequest& request, const RequestLimits& limits);

// InvalidArgument "<field>[i]: token id X is outside the model vocabulary [0, V)" for the
// first id outside [0, vocab_size); OK otherwise.
absl::Status ValidateTokenIds(absl::string_view field, absl::Span<const int32_t> ids,
                              int vocab_size);

}  // namespace dcf
