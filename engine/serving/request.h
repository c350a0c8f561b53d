// Plain data types of one generation request and of what it streams back. Transport-free:
// server/ converts proto messages to and from these.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/sampling/sampling_params.h"

namespace dcf {

struct StoppingCriteria {
  int32_t max_new_tokens = 16;              // >= 1
  std::vector<int32_t> stop_token_ids;      // finish with kStopToken (token is emitted)
  std::vector<std::string> stop_strings;    // matched on detokenized text across tokens
  bool include_stop_string = false;         // emit the matched stop string itself
  bool ignore_eos = false;                  // keep going after the model's EOS
  std::optional<int32_t> eos_token_id;      // overrides the engine's EOS for this request
};

struct OutputOptions {
  bool logprobs = false;      // logprob of each chosen token
  int32_t top_logprobs = 0;   // also the n most likely alternatives, [0, kMaxTopLogprobs]
  bool text = true;           // detokenize (needs a tokenizer)
};

struct GenerationRequest {
  std::string id;                      // echoed; engine assigns one when empty
  // Opaque to the engine: which front sent the request, handed back to the EngineObserver's
  // per-request hooks (the server's metrics label by it: gRPC or HTTP).
  int origin = 0;
  std::vector<int32_t> prompt_tokens;  // non-empty, ids < vocab size
  // Prefix caching: requests share cached KV blocks only with requests of the same salt
  // (empty: those that set none). At most kMaxCacheSaltBytes.
  std::string cache_salt;
  // Speculative decoding (EngineOptions::spec_tokens > 0) may verify drafted tokens for this
  // request; false opts out. Either way the output is the same (docs/DESIGN.md).
  bool speculate = true;
  SamplingParams sampling;
  StoppingCriteria stopping;
  OutputOptions output;
};

// Why a request ended. kUnspecified is never reported for a finished request.
enum class FinishReason {
  kUnspecified = 0,
  kLength,       // max_new_tokens reached (or the model context)
  kEos,
  kStopToken,
  kStopString,
  kCancelled,
  kError,
};
const char* FinishReasonName(FinishReason reason);

// Lifecycle of a request inside the engine. Transitions happen only in the engine loop:
//   kQueued -> kPrefill -> kDecode -> kFinished
//   kPrefill/kDecode -> kPreempted -> kPrefill (recompute)
//   kPreempted -> kFinished (pipelined steps: preempted while a step in flight sampled the
//     token that ends it)
//   any non-final -> kCancelled | kFailed
enum class RequestState { kQueued, kPrefill, kDecode, kPreempted, kFinished, kCancelled, kFailed };
const char* RequestStateName(RequestState state);
inline bool IsFinal(RequestState s) {
  return s == RequestState::kFinished || s == RequestState::kCancelled ||
         s == RequestState::kFailed;
}
// The transition table above: true when `from` may move to `to`. (A prefill whose last chunk
// samples a token that already ends the request goes kPrefill -> kFinished directly.)
bool IsValidTransition(RequestState from, RequestState to);

struct TokenOutput {
  int32_t token = 0;
  float logprob = 0;                 // set when OutputOptions::logprobs: log-softmax of the raw
                                     // model logits (before penalties and temperature)
  std::vector<TopLogprob> top;       // OutputOptions::top_logprobs entries, best first
};

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t generated_tokens = 0;
  // Prompt tokens whose KV came from the prefix cache when the request was first scheduled
  // (they were not computed for it).
  int32_t cached_tokens = 0;
  // Speculative decoding: tokens drafted for the request and verified, and how many of them
  // verification accepted (0 and 0 without speculation).
  int32_t draft_tokens = 0;
  int32_t accepted_draft_tokens = 0;
};

struct Timing {
  absl::Duration queue_time;        // enqueue -> first scheduled
  absl::Duration time_to_first_token;  // enqueue -> first token emitted
  absl::Duration total;             // enqueue -> finish
};

// What a consumer takes from a RequestStream: everything that arrived since the last take.
struct GenerationChunk {
  std::vector<TokenOutput> tokens;
  std::string text;             // UTF-8-safe delta for these tokens (when OutputOptions::text)
  bool finished = false;        // true on the last chunk; then the fields below are set
  FinishReason finish_reason = FinishReason::kUnspecified;
  absl::Status error;           // non-OK only with kError
  Usage usage;
  Timing timing;
};

}  // namespace dcf
