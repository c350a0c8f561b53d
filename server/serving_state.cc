#include "server/serving_state.h"

#include <chrono>
#include <vector>

#include "absl/strings/str_cat.h"

#include "server/status_util.h"

namespace dcf::server {

int64_t SteadyNowNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

grpc::Status ServingState::Admit(
    const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const {
  if (auth_ != nullptr) {
    if (absl::Status s = auth_->Check(metadata); !s.ok()) {
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

grpc::Status ServingState::RegisterStream(std::shared_ptr<OpenStream> stream) {
  const int max_open = options_->max_open_streams;
  const int max_per_peer = options_->max_open_streams_per_peer;
  absl::MutexLock lock(&mu_);
  const int open = static_cast<int>(streams_.size());
  if (max_open > 0 && open >= max_open) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat(open, " Generate streams are open, the most this server "
                                     "keeps (--max-open-streams); retry with backoff"));
  }
  auto [it, inserted] = streams_per_peer_.try_emplace(stream->peer, 0);
  if (max_per_peer > 0 && it->second >= max_per_peer) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat(it->second, " Generate streams from this client address are "
                                     "open, the most one address may hold "
                                     "(--max-open-streams-per-peer); retry with backoff"));
  }
  ++it->second;
  streams_.insert(std::move(stream));
  return grpc::Status::OK;
}

void ServingState::StreamDone(const std::shared_ptr<OpenStream>& stream) {
  absl::MutexLock lock(&mu_);
  if (streams_.erase(stream) == 0) return;
  auto it = streams_per_peer_.find(stream->peer);
  if (it != streams_per_peer_.end() && --it->second <= 0) streams_per_peer_.erase(it);
}

int ServingState::EndStalledStreams(int64_t now_ns) {
  std::vector<std::shared_ptr<OpenStream>> stalled;
  {
    absl::MutexLock lock(&mu_);
    for (const std::shared_ptr<OpenStream>& s : streams_) {
      if (s->write_deadline_ns.load(std::memory_order_relaxed) < now_ns) stalled.push_back(s);
    }
  }
  // Without the lock: ending a call may run its reactions (and StreamDone) on this thread.
  for (const std::shared_ptr<OpenStream>& s : stalled) s->EndIfStalled(now_ns);
  return static_cast<int>(stalled.size());
}

}  // namespace dcf::server
