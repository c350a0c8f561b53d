// The request side of the OpenAI-compatible front (openai_service.h): JSON bodies of
// POST /v1/completions and /v1/chat/completions parsed into OpenAiRequest, then planned into
// the engine's GenerationRequests (one per choice: prompt x n). Pure functions, thread-safe;
// the libFuzzer target tests/fuzz/openai_fuzz.cc drives them.
//
// Field semantics follow the OpenAI API reference and vLLM's server (docs/OPENAI_API.md has
// the table): what the engine does is supported, vLLM's extra names map to what the gRPC API
// has beyond OpenAI's (top_k, min_p, repetition_penalty, ignore_eos, stop_token_ids,
// include_stop_str_in_output), what it does not do is refused naming the field (tools,
// response_format other than text, logit_bias, ...), unknown fields are ignored.
//
// Errors are InvalidArgument (OutOfRange for a prompt over the limits, NotFound for another
// model) whose message starts with the OpenAI parameter's path and ": " ("temperature: must
// be a number, got string", "messages[1].content: ..."); OpenAiParam() takes the path back
// out for the error object's "param".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/serving/request.h"
#include "engine/serving/request_validator.h"
#include "server/chat_template.h"

namespace dcf::server {

enum class OpenAiApi { kCompletions, kChatCompletions };

// The most choices one request may ask for (prompts x n).
inline constexpr int kMaxOpenAiChoices = 128;

struct OpenAiPrompt {
  bool is_text = true;
  std::string text;
  std::vector<int32_t> token_ids;
};

struct OpenAiRequest {
  OpenAiApi api = OpenAiApi::kCompletions;
  std::string model;
  std::vector<OpenAiPrompt> prompts;  // completions: one or more; chat: none (see messages)
  std::vector<ChatMessage> messages;  // chat
  bool add_generation_prompt = true;  // chat (vLLM's extra)
  int n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool echo = false;           // completions
  // Alternatives per token: completions `logprobs` (0..20, and -1 when absent); chat
  // `top_logprobs` when `logprobs` is true.
  int top_logprobs = -1;
  bool logprobs = false;  // log-probabilities of the chosen tokens are wanted
  std::optional<int64_t> max_tokens;
  const char* max_tokens_param = "max_tokens";  // or "max_completion_tokens"
  SamplingParams sampling;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool include_stop_str_in_output = false;
  bool ignore_eos = false;
  bool speculate = true;  // our extra: false opts out of speculative decoding
  // vLLM's extra, the gRPC field's twin: prefix-cache blocks are shared only between requests
  // of the same salt (empty: those that set none); validated as gRPC's (ValidateRequest).
  std::string cache_salt;
};

// Parses and type-checks `body`. InvalidArgument naming the field for bad JSON, invalid UTF-8
// (found with the path of the string that holds it), wrong types, values out of their JSON
// range, and features this server refuses.
absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(OpenAiApi api, absl::string_view body);

// What the engine runs for one request: requests[p * n + i] is choice i of prompt p, and the
// index that choice has in the response.
struct OpenAiPlan {
  std::vector<GenerationRequest> requests;
  std::vector<std::string> prompt_texts;  // per prompt: what `echo` prepends
  std::vector<int> prompt_tokens;         // per prompt
};

// Builds the engine requests: text prompts tokenized within the prompt limit (as gRPC's
// ToEngineRequest does), chat messages rendered with `chat_template` (null: the model has
// none, and chat is refused), unset max_tokens given OpenAI's defaults within the engine's
// limits, choice i seeded with seed + i. Every request then passes the engine's validator
// (the one Enqueue applies), with its field names given back in OpenAI's: so a plan either
// holds only requests the engine accepts (up to its queue) or fails with nothing enqueued.
struct ChatTemplateContext {
  const ChatTemplate* chat_template = nullptr;
  std::string bos_token;
  std::string eos_token;
};
absl::StatusOr<OpenAiPlan> PlanOpenAiRequest(const OpenAiRequest& request,
                                             const RequestLimits& limits,
                                             const ChatTemplateContext& chat);

// `status`, an engine Status about prompt `prompt` of `request` (the validator's, or
// Engine::EnqueueAll's refusal), with OpenAI's names for the engine's fields: prompt_tokens ->
// prompt / prompt[k] / messages, stopping.max_new_tokens -> max_tokens, sampling.x -> x,
// requests (the group of all choices) -> n (when n > 1) / prompt / messages...
absl::Status InOpenAiTerms(const absl::Status& status, const OpenAiRequest& request, int prompt);

// The parameter path an error of the functions above names ("" when none), and the message
// with that path (the text after "<path>: ").
std::string OpenAiParam(const absl::Status& status);

}  // namespace dcf::server
