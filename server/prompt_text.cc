#include "server/prompt_text.h"

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/tokenizer.h"

namespace dcf::server {

absl::StatusOr<std::vector<int32_t>> EncodeTextPrompt(absl::string_view text,
                                                      const RequestLimits& limits,
                                                      absl::string_view field,
                                                      absl::string_view no_tokenizer_hint) {
  if (limits.tokenizer == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": this model has no tokenizer; ", no_tokenizer_hint));
  }
  const size_t budget = limits.max_prompt_tokens > 0
                            ? static_cast<size_t>(limits.max_prompt_tokens)
                            : SIZE_MAX;
  absl::StatusOr<std::vector<int32_t>> ids =
      limits.tokenizer->EncodeWithLimit(std::string_view(text.data(), text.size()), budget);
  if (absl::IsOutOfRange(ids.status())) {
    return absl::OutOfRangeError(absl::StrCat(field, ": encodes to more than ", budget,
                                              " tokens, the limit of prompt tokens"));
  }
  return ids;
}

}  // namespace dcf::server
