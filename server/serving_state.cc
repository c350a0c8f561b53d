#include "server/serving_state.h"

#include "server/status_util.h"

namespace dcf::server {

grpc::Status ServingState::Admit(const grpc::CallbackServerContext& context) const {
  if (auth_ != nullptr) {
    if (absl::Status s = auth_->Check(context.client_metadata()); !s.ok()) {
      return ToGrpcStatus(s);
    }
  }
  if (draining()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is shutting down");
  }
  if (engine() == nullptr) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "server is starting: model not ready");
  }
  return grpc::Status::OK;
}

}  // namespace dcf::server
