// The dcformer.v1.TextGeneration service (gRPC callback API). Generate gets one
// GenerateReactor per call; the unary RPCs finish inline (they never wait on the engine).
#pragma once

#include "dcformer/v1/dcformer.grpc.pb.h"
#include "server/serving_state.h"

namespace dcf::server {

class TextGenerationService final : public v1::TextGeneration::CallbackService {
 public:
  // `state` is not owned and must outlive the gRPC server.
  explicit TextGenerationService(ServingState* state) : state_(state) {}

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context,
                                       const v1::DetokenizeRequest* request,
                                       v1::DetokenizeResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::GetModelInfoResponse* response) override;

 private:
  ServingState* const state_;
};

}  // namespace dcf::server
