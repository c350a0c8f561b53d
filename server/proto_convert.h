// Conversions between the dcformer.v1 proto messages and the engine's plain types. Together
// with status_util.h this is the only code that knows both worlds.
//
// Conversion only: the values are validated once, by the engine (Engine::Enqueue, see
// engine/serving/request_validator.h), whose messages name the field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dcformer/v1/dcformer.pb.h"
#include "engine/serving/request.h"
#include "engine/serving/request_validator.h"

namespace dcf::server {

namespace v1 = ::dcformer::v1;

// Builds the engine request from the engine's resolved limits (Engine::limits(): text
// prompts are tokenized with its tokenizer, and only up to limits.max_prompt_tokens; an unset
// max_new_tokens gets limits.DefaultMaxNewTokens, other unset fields the engine's defaults).
// InvalidArgument when it cannot be built: no prompt, a text prompt on a model without a
// tokenizer, text the tokenizer rejects; OutOfRange for a text prompt longer than
// limits.max_prompt_tokens (found without encoding all of it).
absl::StatusOr<GenerationRequest> ToEngineRequest(const v1::GenerateRequest& request,
                                                  const RequestLimits& limits);

// (Metrics and logs name finish reasons with FinishReasonName, engine/serving/request.h.)
v1::FinishReason ToProtoFinishReason(FinishReason reason);

void ToProtoDuration(absl::Duration d, google::protobuf::Duration* out);

// Fills `out` (cleared first) from a chunk taken from a RequestStream.
void ChunkToResponse(const GenerationChunk& chunk, const std::string& request_id,
                     bool with_logprobs, v1::GenerateResponse* out);

}  // namespace dcf::server
