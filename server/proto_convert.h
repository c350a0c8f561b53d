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

namespace dcf {
class Tokenizer;
}

namespace dcf::server {

namespace v1 = ::dcformer::v1;

// What the conversion needs to know about the model and the server's limits.
struct RequestLimits {
  int32_t vocab_size = 0;
  int32_t context_length = 0;         // model positions
  int32_t default_max_new_tokens = 256;
  int32_t max_new_tokens_limit = 0;   // --max-new-tokens; 0 = no limit beyond the context
  // The longest prompt the engine accepts; a text prompt is encoded only up to it. 0 = none.
  int32_t max_prompt_tokens = 0;
  const Tokenizer* tokenizer = nullptr;  // null: text features are rejected
};

// Builds the engine request (text prompts are tokenized; unset fields get the engine's or the
// server's defaults). InvalidArgument when it cannot be built: no prompt, a text prompt on a
// model without a tokenizer, text the tokenizer rejects; OutOfRange for a text prompt longer
// than `max_prompt_tokens` (found without encoding all of it).
absl::StatusOr<GenerationRequest> ToEngineRequest(const v1::GenerateRequest& request,
                                                  const RequestLimits& limits);

v1::FinishReason ToProtoFinishReason(FinishReason reason);
// Lower-case label ("eos", "length", ...) for metrics and logs.
const char* FinishReasonLabel(FinishReason reason);

void ToProtoDuration(absl::Duration d, google::protobuf::Duration* out);

// Fills `out` (cleared first) from a chunk taken from a RequestStream.
void ChunkToResponse(const GenerationChunk& chunk, const std::string& request_id,
                     bool with_logprobs, v1::GenerateResponse* out);

}  // namespace dcf::server
