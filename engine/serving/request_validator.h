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
#include <optional>

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
inline constexpr int kMaxCacheSaltBytes = 256;

class Tokenizer;

// What one engine accepts, resolved once at Engine::Create (Engine::limits()): the server and
// the tools read these values and recompute none of them.
struct RequestLimits {
  int vocab_size = 0;            // model vocabulary: prompt / stop / eos ids must be below it
  int context = 0;               // model context (max positions)
  int max_prompt_tokens = 0;     // resolved: EngineOptions::max_prompt_tokens within the context
  int max_new_tokens_limit = 0;  // resolved: EngineOptions::max_new_tokens_limit within it
  int default_max_new_tokens = 256;  // for requests that leave max_new_tokens unset
  // The EOS generation stops at unless a request overrides or ignores it: the tokenizer's
  // <|endoftext|>; none without a tokenizer (config.json's eos_token_id is not used).
  std::optional<int32_t> eos_token_id;
  const Tokenizer* tokenizer = nullptr;  // null: no text prompts, text output or stop strings

  // max_new_tokens for a request that leaves it unset: the default, shortened to the limit
  // and to the context left after a prompt of `prompt_len` tokens; at least 1.
  int DefaultMaxNewTokens(int prompt_len) const;
};

// The one resolution of the limits (the engine's, Engine::limits(), and dcformer-generate's):
// `max_prompt_tokens` and `max_new_tokens_limit` (0 = the context) within the model context
// `context`; the EOS is the tokenizer's (none without one).
RequestLimits ResolveRequestLimits(int vocab_size, int context, int max_prompt_tokens,
                                   int max_new_tokens_limit, int default_max_new_tokens,
                                   const Tokenizer* tokenizer);

// InvalidArgument (message names the field) for malformed values; OutOfRange when the prompt
// or max_new_tokens exceed the limits or their sum exceeds the context.
absl::Status ValidateRequest(const GenerationRequest& request, const RequestLimits& limits);

// InvalidArgument "<field>[i]: token id X is outside the model vocabulary [0, V)" for the
// first id outside [0, vocab_size); OK otherwise.
absl::Status ValidateTokenIds(absl::string_view field, absl::Span<const int32_t> ids,
                              int vocab_size);

}  // namespace dcf
