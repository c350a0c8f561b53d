#include "engine/serving/request_validator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/sampling/sampling_params.h"
#include "engine/tokenizer/tokenizer.h"

namespace dcf {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

}  // namespace

absl::Status ValidateTokenIds(absl::string_view field, absl::Span<const int32_t> ids,
                              int vocab_size) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "]: token id ", ids[i],
                       " is outside the model vocabulary [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

RequestLimits ResolveRequestLimits(int vocab_size, int context, int max_prompt_tokens,
                                   int max_new_tokens_limit, int default_max_new_tokens,
                                   const Tokenizer* tokenizer) {
  RequestLimits limits;
  limits.vocab_size = vocab_size;
  limits.context = context;
  limits.max_prompt_tokens =
      max_prompt_tokens > 0 ? std::min(max_prompt_tokens, context) : context;
  limits.max_new_tokens_limit =
      max_new_tokens_limit > 0 ? std::min(max_new_tokens_limit, context) : context;
  limits.default_max_new_tokens = default_max_new_tokens;
  limits.eos_token_id = tokenizer != nullptr ? tokenizer->eos_token_id() : std::nullopt;
  limits.tokenizer = tokenizer;
  return limits;
}

int RequestLimits::DefaultMaxNewTokens(int prompt_len) const {
  return std::max(1, std::min({default_max_new_tokens, max_new_tokens_limit, context - prompt_len}));
}

absl::Status ValidateRequest(const GenerationRequest& r, const RequestLimits& lim) {
  // "request_id", the field's name in the API (GenerationRequest::id).
  if (r.id.size() > static_cast<size_t>(kMaxRequestIdBytes)) {
    return Invalid("request_id", absl::StrCat("must be at most ", kMaxRequestIdBytes,
                                              " bytes, got ", r.id.size()));
  }
  for (size_t i = 0; i < r.id.size(); ++i) {
    const char c = r.id[i];
    if (c < 0x21 || c > 0x7e) {
      return Invalid("request_id",
                     absl::StrCat("must be printable ASCII without spaces (byte ", i, ")"));
    }
  }
  if (r.cache_salt.size() > static_cast<size_t>(kMaxCacheSaltBytes)) {
    return Invalid("cache_salt", absl::StrCat("longer than ", kMaxCacheSaltBytes, " bytes"));
  }
  if (r.prompt_tokens.empty()) return Invalid("prompt_tokens", "is empty");
  RETURN_IF_ERROR(ValidateTokenIds("prompt_tokens", r.prompt_tokens, lim.vocab_size));
  RETURN_IF_ERROR(ValidateSamplingParams(r.sampling));

  const StoppingCriteria& s = r.stopping;
  if (s.max_new_tokens < 1) {
    return Invalid("stopping.max_new_tokens", absl::StrCat("must be >= 1, got ", s.max_new_tokens));
  }
  if (s.stop_token_ids.size() > static_cast<size_t>(kMaxStopTokenIds)) {
    return Invalid("stopping.stop_token_ids", absl::StrCat("more than ", kMaxStopTokenIds, " ids"));
  }
  RETURN_IF_ERROR(ValidateTokenIds("stopping.stop_token_ids", s.stop_token_ids, lim.vocab_size));
  if (s.stop_strings.size() > static_cast<size_t>(kMaxStopStrings)) {
    return Invalid("stopping.stop_strings", absl::StrCat("more than ", kMaxStopStrings, " strings"));
  }
  for (size_t i = 0; i < s.stop_strings.size(); ++i) {
    const size_t n = s.stop_strings[i].size();
    if (n == 0 || n > static_cast<size_t>(kMaxStopStringBytes)) {
      return Invalid(absl::StrCat("stopping.stop_strings[", i, "]"),
                     absl::StrCat("must be 1 to ", kMaxStopStringBytes, " bytes, got ", n));
    }
  }
  if (!s.stop_strings.empty() && lim.tokenizer == nullptr) {
    return Invalid("stopping.stop_strings", "needs a tokenizer, and this model has none");
  }
  if (s.eos_token_id.has_value()) {
    RETURN_IF_ERROR(ValidateTokenIds("stopping.eos_token_id", {*s.eos_token_id}, lim.vocab_size));
  }

  if (r.output.top_logprobs < 0 || r.output.top_logprobs > kMaxTopLogprobs) {
    return Invalid("output.top_logprobs", absl::StrCat("must be in [0, ", kMaxTopLogprobs,
                                                       "], got ", r.output.top_logprobs));
  }
  if (r.output.text && lim.tokenizer == nullptr) {
    return Invalid("output.text", "needs a tokenizer, and this model has none");
  }

  const int64_t prompt = static_cast<int64_t>(r.prompt_tokens.size());
  if (prompt > lim.max_prompt_tokens) {
    return absl::OutOfRangeError(absl::StrCat("prompt_tokens: ", prompt,
                                              " tokens exceed the limit of ",
                                              lim.max_prompt_tokens, " tokens"));
  }
  if (s.max_new_tokens > lim.max_new_tokens_limit) {
    return absl::OutOfRangeError(absl::StrCat("stopping.max_new_tokens: ", s.max_new_tokens,
                                              " exceeds the limit of ",
                                              lim.max_new_tokens_limit));
  }
  if (prompt + s.max_new_tokens > lim.context) {
    return absl::OutOfRangeError(absl::StrCat(
        "stopping.max_new_tokens: prompt (", prompt, " tokens) + max_new_tokens (",
        s.max_new_tokens, ") = ", prompt + s.max_new_tokens, " exceeds the model context of ",
        lim.context, " tokens"));
  }
  return absl::OkStatus();
}

}  // namespace dcf
