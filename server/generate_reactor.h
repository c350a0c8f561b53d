// One server-streaming Generate call: the gRPC callback reactor of a GenerateStream
// (generate_stream.h holds the flow, the bounds and the thread-safety rules; generate_call.h
// the state machine). The reactor only connects gRPC to the stream: its reactions become the
// stream's events, and the stream's writes, finish and cancel become gRPC calls.
//
// Lifetime: created by TextGenerationService::Generate, deleted in OnDone.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "grpcpp/grpcpp.h"
#include "server/generate_stream.h"
#include "server/serving_state.h"

namespace dcf::server {

class GenerateReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer>,
                        private GenerateStream::Rpc {
 public:
  // `request` holds the serialized dcformer.v1.GenerateRequest.
  GenerateReactor(ServingState* state, grpc::CallbackServerContext* context,
                  const grpc::ByteBuffer* request);

  void OnWriteDone(bool ok) override { stream_.OnWriteDone(ok); }
  void OnCancel() override { stream_.OnCancel(); }
  void OnDone() override;

 private:
  ~GenerateReactor() override = default;  // only OnDone deletes

  // GenerateStream::Rpc
  const std::multimap<grpc::string_ref, grpc::string_ref>& client_metadata() const override {
    return context_->client_metadata();
  }
  std::string peer() const override { return context_->peer(); }
  absl::Time deadline() const override;
  bool IsCancelled() const override { return context_->IsCancelled(); }
  void StartWrite(const grpc::ByteBuffer* message) override {
    grpc::ServerWriteReactor<grpc::ByteBuffer>::StartWrite(message);
  }
  void Finish(const grpc::Status& status) override {
    grpc::ServerWriteReactor<grpc::ByteBuffer>::Finish(status);
  }
  std::function<void()> PrepareCancel(const grpc::Status& status) override;

  grpc::CallbackServerContext* const context_;
  GenerateStream stream_;
};

}  // namespace dcf::server
