#include "server/serving_state.h"

#include <vector>

#include "absl/strings/str_cat.h"

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

grpc::Status ServingState::CheckRequestSize(const grpc::ByteBuffer& request) const {
  const size_t size = request.Length();
  const size_t limit = static_cast<size_t>(options_->max_receive_message_bytes);
  if (size <= limit) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                      absl::StrCat("the request message is ", size,
                                   " bytes, more than --max-receive-message-bytes (", limit, ")"));
}

int ServingState::EndStalledStreams(absl::Time now) {
  const absl::Time cutoff = now - options_->write_stall_timeout;
  const int64_t cutoff_ns = absl::ToUnixNanos(cutoff);
  std::vector<std::shared_ptr<OpenStream>> stalled;
  {
    absl::MutexLock lock(&mu_);
    for (const std::shared_ptr<OpenStream>& s : streams_) {
      if (s->write_started_ns.load(std::memory_order_relaxed) < cutoff_ns) stalled.push_back(s);
    }
  }
  // Without the lock: ending a call may run its reactions (and StreamDone) on this thread.
  for (const std::shared_ptr<OpenStream>& s : stalled) s->EndIfStalled(cutoff);
  return static_cast<int>(stalled.size());
}

}  // namespace dcf::server
