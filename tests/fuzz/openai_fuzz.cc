// libFuzzer target over OpenAI request bodies, as a client sends them to /v1/completions and
// /v1/chat/completions: JSON parsing, type checks and refusals (server/openai_request.h), the
// chat template (a ChatML one, as many models carry), planning into engine requests and the
// engine's validation, with the GPT-2 tokenizer and no model. The first input byte picks the
// endpoint: even = completions, odd = chat.
// Properties (a violation aborts, which libFuzzer reports as a crash):
//  * nothing crashes, leaks or trips a sanitizer (deep nesting, huge numbers, bad UTF-8);
//  * every rejection is INVALID_ARGUMENT or OUT_OF_RANGE with a message, and the parameter it
//    names (OpenAiParam) has no spaces;
//  * a plan holds one request per choice (prompts x n, at most kMaxOpenAiChoices), and every
//    one passes the engine's validator (what Enqueue applies).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "engine/serving/request_validator.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/chat_template.h"
#include "server/openai_request.h"
#include "tests/fuzz/fuzz_common.h"

namespace {

const dcf::server::ChatTemplate& ChatMl() {
  static const dcf::server::ChatTemplate* t = [] {
    auto parsed = dcf::server::ChatTemplate::Parse(
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
        "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|im_start|>assistant\n' }}{% endif %}");
    if (!parsed.ok()) std::abort();
    return parsed->release();
  }();
  return *t;
}

void Check(bool cond, const char* what, const absl::Status& status = absl::OkStatus()) {
  dcf::fuzz::Check(cond, "openai_fuzz", what, status);
}

void CheckRejection(const absl::Status& s, const char* stage) {
  dcf::fuzz::CheckRejection(s, "openai_fuzz", stage);
  Check(dcf::server::OpenAiParam(s).find(' ') == std::string::npos, "param has no spaces", s);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto api = (data[0] & 1) ? dcf::server::OpenAiApi::kChatCompletions
                                 : dcf::server::OpenAiApi::kCompletions;
  const absl::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  absl::StatusOr<dcf::server::OpenAiRequest> request = dcf::server::ParseOpenAiRequest(api, body);
  if (!request.ok()) {
    CheckRejection(request.status(), "parse");
    return 0;
  }
  const dcf::RequestLimits limits = dcf::fuzz::Gpt2Limits();
  dcf::server::ChatTemplateContext chat;
  chat.chat_template = &ChatMl();
  absl::StatusOr<dcf::server::OpenAiPlan> plan =
      dcf::server::PlanOpenAiRequest(*request, limits, chat);
  if (!plan.ok()) {
    CheckRejection(plan.status(), "plan");
    return 0;
  }
  const size_t prompts = api == dcf::server::OpenAiApi::kChatCompletions
                             ? 1
                             : request->prompts.size();
  Check(plan->requests.size() == prompts * request->n, "one request per choice");
  Check(plan->requests.size() <= dcf::server::kMaxOpenAiChoices, "choices within the cap");
  for (const dcf::GenerationRequest& g : plan->requests) {
    const absl::Status valid = dcf::ValidateRequest(g, limits);
    Check(valid.ok(), "a planned request passes the validator", valid);
  }
  return 0;
}
