#include "server/text_generation_service.h"

#include "absl/strings/str_cat.h"
#include "engine/serving/request_validator.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/generate_reactor.h"
#include "server/request_parser.h"
#include "server/status_util.h"
#include "server/wire.h"

namespace dcf::server {
namespace {

template <typename Message>
grpc::Status Parse(const ServingState& state, const grpc::ByteBuffer& bytes, Message* out) {
  if (!bytes.Valid()) {
    // No message at all: the client ended the call before gRPC read one, or closed its side
    // without sending one.
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the call carried no request message");
  }
  if (grpc::Status s = state.CheckRequestSize(bytes); !s.ok()) return s;
  return ToGrpcStatus(ParseRequestBytes(ByteBufferToString(bytes), out));
}

// Serializes a unary response, or refuses one gRPC would refuse to send (so that the call is
// counted with the status the client sees, not as ok).
grpc::Status SerializeResponse(const ServingState& state, const google::protobuf::Message& message,
                               grpc::ByteBuffer* out) {
  const size_t size = message.ByteSizeLong();
  const size_t limit = static_cast<size_t>(state.options().max_send_message_bytes);
  if (size > limit) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("the response would be ", size,
                                     " bytes, more than --max-send-message-bytes (", limit,
                                     "); ask for less"));
  }
  SerializeToByteBuffer(message, out);
  return grpc::Status::OK;
}

}  // namespace

grpc::ServerUnaryReactor* TextGenerationService::FinishUnary(grpc::CallbackServerContext* context,
                                                             const char* method,
                                                             const grpc::Status& status) {
  state_->metrics().RecordUnaryRequest(method, GrpcCodeLabel(status.error_code()));
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* TextGenerationService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  return new GenerateReactor(state_, context, request);  // deletes itself in OnDone
}

grpc::ServerUnaryReactor* TextGenerationService::Tokenize(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request,
                                                          grpc::ByteBuffer* response) {
  return FinishUnary(context, "Tokenize", DoTokenize(*context, *request, response));
}

grpc::ServerUnaryReactor* TextGenerationService::Detokenize(grpc::CallbackServerContext* context,
                                                            const grpc::ByteBuffer* request,
                                                            grpc::ByteBuffer* response) {
  return FinishUnary(context, "Detokenize", DoDetokenize(*context, *request, response));
}

grpc::ServerUnaryReactor* TextGenerationService::GetModelInfo(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return FinishUnary(context, "GetModelInfo", DoGetModelInfo(*context, *request, response));
}

grpc::Status TextGenerationService::DoTokenize(const grpc::CallbackServerContext& context,
                                               const grpc::ByteBuffer& request_bytes,
                                               grpc::ByteBuffer* response_bytes) {
  if (grpc::Status s = state_->Admit(context); !s.ok()) return s;
  v1::TokenizeRequest request;
  if (grpc::Status s = Parse(*state_, request_bytes, &request); !s.ok()) return s;
  const Tokenizer* tokenizer = state_->limits().tokenizer;
  if (tokenizer == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this model has no tokenizer");
  }
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(request.text());
  if (!ids.ok()) return ToGrpcStatus(ids.status());
  v1::TokenizeResponse response;
  response.mutable_token_ids()->Add(ids->begin(), ids->end());
  return SerializeResponse(*state_, response, response_bytes);
}

grpc::Status TextGenerationService::DoDetokenize(const grpc::CallbackServerContext& context,
                                                 const grpc::ByteBuffer& request_bytes,
                                                 grpc::ByteBuffer* response_bytes) {
  if (grpc::Status s = state_->Admit(context); !s.ok()) return s;
  v1::DetokenizeRequest request;
  if (grpc::Status s = Parse(*state_, request_bytes, &request); !s.ok()) return s;
  const Tokenizer* tokenizer = state_->limits().tokenizer;
  if (tokenizer == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "this model has no tokenizer");
  }
  std::vector<int32_t> ids(request.token_ids().begin(), request.token_ids().end());
  if (absl::Status s = ValidateTokenIds("token_ids", ids, state_->limits().vocab_size); !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::StatusOr<std::string> text = tokenizer->Decode(ids, request.skip_special_tokens());
  if (!text.ok()) return ToGrpcStatus(text.status());
  v1::DetokenizeResponse response;
  response.set_text(*std::move(text));
  return SerializeResponse(*state_, response, response_bytes);
}

grpc::Status TextGenerationService::DoGetModelInfo(const grpc::CallbackServerContext& context,
                                                   const grpc::ByteBuffer& request_bytes,
                                                   grpc::ByteBuffer* response_bytes) {
  if (grpc::Status s = state_->Admit(context); !s.ok()) return s;
  v1::GetModelInfoRequest request;
  if (grpc::Status s = Parse(*state_, request_bytes, &request); !s.ok()) return s;
  v1::GetModelInfoResponse response;
  ToProtoModelInfo(state_->engine()->config(), state_->info(), &response);
  return SerializeResponse(*state_, response, response_bytes);
}

}  // namespace dcf::server
