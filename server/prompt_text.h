// Text prompts to token ids, for every front (gRPC's proto_convert.h, the OpenAI front's
// openai_request.h): one rule for the prompt limit, so that both refuse the same prompts the
// same way.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/serving/request_validator.h"

namespace dcf::server {

// Encodes `text` with limits.tokenizer, only up to limits.max_prompt_tokens: a megabyte of
// text the engine would refuse anyway costs no more than the limit's worth of encoding.
// InvalidArgument "<field>: this model has no tokenizer; <no_tokenizer_hint>" without a
// tokenizer; OutOfRange "<field>: encodes to more than N tokens, the limit of prompt tokens";
// the tokenizer's own error otherwise.
absl::StatusOr<std::vector<int32_t>> EncodeTextPrompt(absl::string_view text,
                                                      const RequestLimits& limits,
                                                      absl::string_view field,
                                                      absl::string_view no_tokenizer_hint);

}  // namespace dcf::server
