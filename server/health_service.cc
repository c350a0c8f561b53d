#include "server/health_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "grpc/grpc.h"
#include "server/peer_address.h"

namespace dcf::server {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// Reaches a WatchReactor from SetServing; OnDone clears it, so a late notification never
// touches a deleted reactor.
struct HealthService::WatchLink {
  absl::Mutex mu;
  WatchReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
};

// One Watch stream. One write in flight at a time; a status that changes meanwhile is
// written once the write completes (only the latest). StartWrite and Finish are called
// without a lock held, by the thread that claimed them under the link's lock (as in
// GenerateReactor): a claimed write or finish keeps the reactor alive until it completes.
class HealthService::WatchReactor : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  WatchReactor(HealthService* service, grpc::CallbackServerContext* context,
               const std::string& name)
      : service_(service),
        context_(context),
        known_(name.empty() || service->services_.count(name) > 0),
        link_(std::make_shared<WatchLink>()) {
    {
      absl::MutexLock lock(&link_->mu);
      link_->reactor = this;
    }
    id_ = service_->AddWatcher(link_, PeerAddress(context->peer()));
    Notify(link_);
  }

  // Closes the stream for a newer one (watch_slots.h): the call is cancelled with
  // UNIMPLEMENTED, which also completes a write that a client that does not read holds.
  static void Evict(const std::shared_ptr<WatchLink>& link, int max_total, int max_per_peer) {
    grpc_call* call;
    {
      absl::MutexLock lock(&link->mu);
      if (link->reactor == nullptr) return;  // done already
      call = link->reactor->context_->c_call();
      grpc_call_ref(call);
    }
    const std::string message = absl::StrCat(
        "too many health Watch streams (at most ", max_per_peer, " from one address, ",
        max_total, " in all): this one, the oldest of the address with the most, was closed "
        "for a newer one; health Check still answers");
    grpc_call_cancel_with_status(call, GRPC_STATUS_UNIMPLEMENTED, message.c_str(), nullptr);
    grpc_call_unref(call);
  }

  // Writes the current status if it changed since the last write (or finishes a cancelled
  // stream once no write is in flight).
  static void Notify(const std::shared_ptr<WatchLink>& link) {
    WatchReactor* reactor;
    Action action;
    {
      absl::MutexLock lock(&link->mu);
      reactor = link->reactor;
      if (reactor == nullptr) return;
      action = reactor->Pump();
    }
    reactor->Perform(action);
  }

  void OnWriteDone(bool ok) override {
    Action action;
    {
      absl::MutexLock lock(&link_->mu);
      write_in_flight_ = false;
      if (!ok) cancelled_ = true;  // the stream broke
      action = Pump();
    }
    Perform(action);
  }

  void OnCancel() override {
    Action action;
    {
      absl::MutexLock lock(&link_->mu);
      cancelled_ = true;
      action = Pump();
    }
    Perform(action);
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&link_->mu);
      link_->reactor = nullptr;
    }
    service_->RemoveWatcher(id_);
    delete this;
  }

 private:
  enum class Action { kNone, kWrite, kFinish };

  HealthCheckResponse::ServingStatus Current() const {
    if (!known_) return HealthCheckResponse::SERVICE_UNKNOWN;
    return service_->serving() ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
  }

  Action Pump() ABSL_EXCLUSIVE_LOCKS_REQUIRED(link_->mu) {
    if (finish_called_ || write_in_flight_) return Action::kNone;
    if (cancelled_) {
      finish_called_ = true;
      return Action::kFinish;
    }
    const HealthCheckResponse::ServingStatus now = Current();
    if (now == sent_) return Action::kNone;
    sent_ = now;
    response_.set_status(now);
    write_in_flight_ = true;
    return Action::kWrite;
  }

  void Perform(Action action) {
    if (action == Action::kWrite) StartWrite(&response_);
    if (action == Action::kFinish) Finish(grpc::Status::CANCELLED);  // may delete `this`
  }

  HealthService* const service_;
  grpc::CallbackServerContext* const context_;
  const bool known_;
  const std::shared_ptr<WatchLink> link_;
  uint64_t id_ = 0;  // set in the constructor, read in OnDone
  HealthCheckResponse response_ ABSL_GUARDED_BY(link_->mu);  // the write in flight
  HealthCheckResponse::ServingStatus sent_ ABSL_GUARDED_BY(link_->mu) =
      HealthCheckResponse::UNKNOWN;
  bool write_in_flight_ ABSL_GUARDED_BY(link_->mu) = false;
  bool cancelled_ ABSL_GUARDED_BY(link_->mu) = false;
  bool finish_called_ ABSL_GUARDED_BY(link_->mu) = false;
};

HealthService::HealthService(std::vector<std::string> services, int max_watchers,
                             int max_watchers_per_peer)
    : services_(services.begin(), services.end()),
      max_watchers_(max_watchers),
      max_watchers_per_peer_(max_watchers_per_peer),
      slots_(max_watchers, max_watchers_per_peer) {}

HealthService::~HealthService() = default;

void HealthService::SetServing(bool serving) {
  std::vector<std::shared_ptr<WatchLink>> watchers;
  {
    absl::MutexLock lock(&mu_);
    if (serving_ == serving) return;
    serving_ = serving;
    for (const auto& [id, link] : watchers_) watchers.push_back(link);
  }
  for (const std::shared_ptr<WatchLink>& link : watchers) WatchReactor::Notify(link);
}

bool HealthService::serving() const {
  absl::MutexLock lock(&mu_);
  return serving_;
}

int HealthService::open_watchers() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(watchers_.size());
}

uint64_t HealthService::AddWatcher(const std::shared_ptr<WatchLink>& link,
                                   const std::string& peer) {
  std::shared_ptr<WatchLink> evicted;
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    id = next_id_++;
    if (std::optional<uint64_t> victim = slots_.Add(id, peer); victim.has_value()) {
      auto it = watchers_.find(*victim);
      if (it != watchers_.end()) {
        evicted = std::move(it->second);
        watchers_.erase(it);
      }
    }
    watchers_[id] = link;
  }
  // Without the lock: the cancel may run the evicted stream's reactions on this thread.
  if (evicted != nullptr) WatchReactor::Evict(evicted, max_watchers_, max_watchers_per_peer_);
  return id;
}

void HealthService::RemoveWatcher(uint64_t id) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(id);
  slots_.Remove(id);
}

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* context,
                                               const HealthCheckRequest* request,
                                               HealthCheckResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!request->service().empty() && services_.count(request->service()) == 0) {
    reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND,
                                 absl::StrCat("unknown service '", request->service(), "'")));
    return reactor;
  }
  response->set_status(serving() ? HealthCheckResponse::SERVING
                                 : HealthCheckResponse::NOT_SERVING);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext* context, const HealthCheckRequest* request) {
  return new WatchReactor(this, context, request->service());  // deletes itself in OnDone
}

}  // namespace dcf::server
