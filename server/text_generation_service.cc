#include "server/text_generation_service.h"

#include "absl/strings/str_cat.h"
#include "engine/serving/request_validator.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/generate_reactor.h"
#include "server/status_util.h"

namespace dcf::server {
namespace {

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context,
                                      const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

}  // namespace

grpc::ServerWriteReactor<v1::GenerateResponse>* TextGenerationService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  return new GenerateReactor(state_, context, request);  // deletes itself in OnDone
}

grpc::ServerUnaryReactor* TextGenerationService::Tokenize(grpc::CallbackServerContext* context,
                                                          const v1::TokenizeRequest* request,
                                                          v1::TokenizeResponse* response) {
  if (grpc::Status s = state_->Admit(*context); !s.ok()) return FinishUnary(context, s);
  const Tokenizer* tokenizer = state_->limits().tokenizer;
  if (tokenizer == nullptr) {
    return FinishUnary(context, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                             "this model has no tokenizer"));
  }
  absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(request->text());
  if (!ids.ok()) return FinishUnary(context, ToGrpcStatus(ids.status()));
  response->mutable_token_ids()->Add(ids->begin(), ids->end());
  return FinishUnary(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* TextGenerationService::Detokenize(
    grpc::CallbackServerContext* context, const v1::DetokenizeRequest* request,
    v1::DetokenizeResponse* response) {
  if (grpc::Status s = state_->Admit(*context); !s.ok()) return FinishUnary(context, s);
  const Tokenizer* tokenizer = state_->limits().tokenizer;
  if (tokenizer == nullptr) {
    return FinishUnary(context, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                             "this model has no tokenizer"));
  }
  std::vector<int32_t> ids(request->token_ids().begin(), request->token_ids().end());
  if (absl::Status s = ValidateTokenIds("token_ids", ids, state_->limits().vocab_size); !s.ok()) {
    return FinishUnary(context, ToGrpcStatus(s));
  }
  absl::StatusOr<std::string> text = tokenizer->Decode(ids, request->skip_special_tokens());
  if (!text.ok()) return FinishUnary(context, ToGrpcStatus(text.status()));
  response->set_text(*std::move(text));
  return FinishUnary(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* TextGenerationService::GetModelInfo(
    grpc::CallbackServerContext* context, const v1::GetModelInfoRequest* request,
    v1::GetModelInfoResponse* response) {
  if (grpc::Status s = state_->Admit(*context); !s.ok()) return FinishUnary(context, s);
  ToProtoModelInfo(state_->engine()->config(), state_->info(), response);
  return FinishUnary(context, grpc::Status::OK);
}

}  // namespace dcf::server
