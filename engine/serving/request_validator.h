// Checks a GenerationRequest against the engine's limits before anything is queued.
// Pure function, thread-safe.
#pragma once

#include "absl/status/status.h"
#include "engine/serving/request.h"

namespace dcf {

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

}  // namespace dcf
