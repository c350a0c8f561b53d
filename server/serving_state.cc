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
  return ToGrpcStatus(CheckAccepting());
}

absl::Status ServingState::CheckAccepting() const {
  if (draining()) return absl::UnavailableError("server is shutting down");
  if (engine() == nullptr) return absl::UnavailableError("server is starting: model not ready");
  return absl::OkStatus();
}

absl::Status ServingState::CheckOpenStreams() const {
  const int max_open = options_->max_open_streams;
  const int open = active_streams();
  if (max_open > 0 && open > max_open) {
    return absl::ResourceExhaustedError(
        absl::StrCat(open - 1, " generation streams are open, the most this server keeps "
                     "(--max-open-streams); retry with backoff"));
  }
  return absl::OkStatus();
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
