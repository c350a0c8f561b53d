#include "server/health_service.h"

#include <utility>

#include "absl/strings/str_cat.h"

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
        known_(name.empty() || service->services_.count(name) > 0),
        peer_(context->peer()),
        link_(std::make_shared<WatchLink>()) {
    {
      absl::MutexLock lock(&link_->mu);
      link_->reactor = this;
    }
    registered_ = service_->AddWatcher(link_, peer_);
    if (!registered_) {
      {
        absl::MutexLock lock(&link_->mu);
        finish_called_ = true;
      }
      Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          "too many health Watch streams are open"));
      return;
    }
    Notify(link_);
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
    if (registered_) service_->RemoveWatcher(link_, peer_);
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
  const bool known_;
  const std::string peer_;
  const std::shared_ptr<WatchLink> link_;
  bool registered_ = false;  // set in the constructor, read in OnDone
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
      max_watchers_per_peer_(max_watchers_per_peer) {}

HealthService::~HealthService() = default;

void HealthService::SetServing(bool serving) {
  std::vector<std::shared_ptr<WatchLink>> watchers;
  {
    absl::MutexLock lock(&mu_);
    if (serving_ == serving) return;
    serving_ = serving;
    watchers.assign(watchers_.begin(), watchers_.end());
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

bool HealthService::AddWatcher(const std::shared_ptr<WatchLink>& link, const std::string& peer) {
  absl::MutexLock lock(&mu_);
  int& from_peer = per_peer_[peer];
  if (static_cast<int>(watchers_.size()) >= max_watchers_ || from_peer >= max_watchers_per_peer_) {
    if (from_peer == 0) per_peer_.erase(peer);
    return false;
  }
  ++from_peer;
  watchers_.insert(link);
  return true;
}

void HealthService::RemoveWatcher(const std::shared_ptr<WatchLink>& link,
                                  const std::string& peer) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(link);
  auto it = per_peer_.find(peer);
  if (it != per_peer_.end() && --it->second <= 0) per_peer_.erase(it);
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
