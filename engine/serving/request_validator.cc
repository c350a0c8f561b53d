#include "engine/serving/request_validator.h"

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/sampling/sampling_params.h"

namespace dcf {
namespace {

bool InVocab(int32_t id, int vocab) { return id >= 0 && id < vocab; }

}  // namespace

absl::Status ValidateRequest(const GenerationRequest& r, const RequestLimits& lim) {
  if (r.prompt_tokens.empty()) return absl::InvalidArgumentError("prompt_tokens is empty");
  for (size_t i = 0; i < r.prompt_tokens.size(); ++i) {
    if (!InVocab(r.prompt_tokens[i], lim.vocab_size)) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt_tokens[", i, "] = ", r.prompt_tokens[i],
                       " is outside the model vocabulary [0, ", lim.vocab_size, ")"));
    }
  }
  RETURN_IF_ERROR(ValidateSamplingParams(r.sampling));
  const StoppingCriteria& s = r.stopping;
  if (s.max_new_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("stopping.max_new_tokens must be >= 1, got ", s.max_new_tokens));
  }
  for (size_t i = 0; i < s.stop_token_ids.size(); ++i) {
    if (!InVocab(s.stop_token_ids[i], lim.vocab_size)) {
      return absl::InvalidArgumentError(
          absl::StrCat("stopping.stop_token_ids[", i, "] = ", s.stop_token_ids[i],
                       " is outside the model vocabulary [0, ", lim.vocab_size, ")"));
    }
  }
  for (size_t i = 0; i < s.stop_strings.size(); ++i) {
    if (s.stop_strings[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("stopping.stop_strings[", i, "] is empty"));
    }
  }
  if (!s.stop_strings.empty() && !lim.has_tokenizer) {
    return absl::InvalidArgumentError(
        "stopping.stop_strings needs a tokenizer, and the engine has none");
  }
  if (s.eos_token_id.has_value() && !InVocab(*s.eos_token_id, lim.vocab_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("stopping.eos_token_id = ", *s.eos_token_id,
                     " is outside the model vocabulary [0, ", lim.vocab_size, ")"));
  }
  if (r.output.top_logprobs < 0 || r.output.top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        absl::StrCat("output.top_logprobs must be in [0, ", kMaxTopLogprobs, "], got ",
                     r.output.top_logprobs));
  }
  if (r.output.text && !lim.has_tokenizer) {
    return absl::InvalidArgumentError("output.text needs a tokenizer, and the engine has none");
  }
  const int64_t prompt = static_cast<int64_t>(r.prompt_tokens.size());
  if (prompt > lim.max_prompt_tokens) {
    return absl::OutOfRangeError(absl::StrCat("prompt of ", prompt,
                                              " tokens exceeds the limit of ",
                                              lim.max_prompt_tokens, " tokens"));
  }
  if (s.max_new_tokens > lim.max_new_tokens_limit) {
    return absl::OutOfRangeError(absl::StrCat("stopping.max_new_tokens = ", s.max_new_tokens,
                                              " exceeds the limit of ",
                                              lim.max_new_tokens_limit));
  }
  if (prompt + s.max_new_tokens > lim.context) {
    return absl::OutOfRangeError(absl::StrCat(
        "prompt (", prompt, " tokens) + max_new_tokens (", s.max_new_tokens, ") = ",
        prompt + s.max_new_tokens, " exceeds the model context of ", lim.context, " tokens"));
  }
  return absl::OkStatus();
}

}  // namespace dcf
