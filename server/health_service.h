// grpc.health.v1.Health, served by the server itself instead of gRPC's default service: the
// same Check/Watch semantics, plus a bound on what Watch streams can cost.
//
// Services: "" (the whole server) and each name given at construction; all share one status,
// set with SetServing. Check answers SERVING / NOT_SERVING, or NOT_FOUND for another name.
// Watch sends the status at once and again on every change (SERVICE_UNKNOWN for another
// name, as the protocol says), until the client ends it or the server shuts down.
//
// Bounds: a Watch stream is one reactor and no thread; at most `max_watchers` are open at
// once, and at most `max_watchers_per_peer` from one client address (the IP, any port: gRPC's
// client-side health checking opens one stream per subchannel, and behind a proxy many
// clients share its address). A new stream is always admitted: when a bound is full, the
// oldest stream of the address that holds the most (watch_slots.h) is closed with
// UNIMPLEMENTED, which gRPC's client-side health checking reads as "no health service:
// treat the server as healthy" (gRFC A17), never as unhealthy; Check still answers it. Health
// never needs an API key: it is what load balancers and probes call.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "server/watch_slots.h"

namespace dcf::server {

class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  HealthService(std::vector<std::string> services, int max_watchers, int max_watchers_per_peer);
  ~HealthService() override;

  // Every service's status; open Watch streams get the change.
  void SetServing(bool serving);
  bool serving() const;
  int open_watchers() const;

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const grpc::health::v1::HealthCheckRequest* request,
                                  grpc::health::v1::HealthCheckResponse* response) override;
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* context,
      const grpc::health::v1::HealthCheckRequest* request) override;

  class WatchReactor;
  struct WatchLink;

 private:
  friend class WatchReactor;
  // Registers a new watcher from `peer` (PeerAddress) and closes the one that makes room for
  // it, if one must. Returns the new watcher's id.
  uint64_t AddWatcher(const std::shared_ptr<WatchLink>& link, const std::string& peer);
  void RemoveWatcher(uint64_t id);

  const std::set<std::string> services_;
  const int max_watchers_;
  const int max_watchers_per_peer_;
  mutable absl::Mutex mu_;
  bool serving_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, std::shared_ptr<WatchLink>> watchers_ ABSL_GUARDED_BY(mu_);
  WatchSlots slots_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dcf::server
