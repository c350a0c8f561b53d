// The dcformer.v1.TextGeneration service (gRPC callback API). Generate gets one
// GenerateReactor per call; the unary RPCs finish inline (they never wait on the engine).
//
// Every method is registered raw (grpc::ByteBuffer in and out): the service parses requests
// itself so that bytes protobuf rejects get INVALID_ARGUMENT with a message naming the field,
// and are counted, instead of gRPC's empty UNIMPLEMENTED (see request_parser.h).
#pragma once

#include "dcformer/v1/dcformer.grpc.pb.h"
#include "server/serving_state.h"

namespace dcf::server {

using TextGenerationRawService = v1::TextGeneration::WithRawCallbackMethod_Generate<
    v1::TextGeneration::WithRawCallbackMethod_Tokenize<
        v1::TextGeneration::WithRawCallbackMethod_Detokenize<
            v1::TextGeneration::WithRawCallbackMethod_GetModelInfo<
                v1::TextGeneration::Service>>>>;

class TextGenerationService final : public TextGenerationRawService {
 public:
  // `state` is not owned and must outlive the gRPC server.
  explicit TextGenerationService(ServingState* state) : state_(state) {}

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;

 private:
  // Each returns the call's status and fills `response` on success.
  grpc::Status DoTokenize(const grpc::CallbackServerContext& context,
                          const grpc::ByteBuffer& request, grpc::ByteBuffer* response);
  grpc::Status DoDetokenize(const grpc::CallbackServerContext& context,
                            const grpc::ByteBuffer& request, grpc::ByteBuffer* response);
  grpc::Status DoGetModelInfo(const grpc::CallbackServerContext& context,
                              const grpc::ByteBuffer& request, grpc::ByteBuffer* response);
  // Finishes a unary call and counts it under `method`.
  grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context, const char* method,
                                        const grpc::Status& status);

  ServingState* const state_;
};

}  // namespace dcf::server
