// State shared by the TextGeneration service, its reactors and the process's main loop.
//
// Lifecycle: created before the gRPC server starts with no engine (calls get UNAVAILABLE
// "starting"); PublishEngine() once the model is loaded and warmed up; StartDraining() once
// the drain on SIGTERM is over (calls that still reach the service get UNAVAILABLE again;
// during the drain gRPC itself refuses new calls, and the ones it accepted before are
// served). The engine outlives the gRPC server.
#pragma once

#include <atomic>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/serving/engine.h"
#include "grpcpp/server_context.h"
#include "server/auth.h"
#include "server/metrics.h"
#include "server/model_info.h"
#include "server/proto_convert.h"
#include "server/server_options.h"
#include "server/stream_writer_pool.h"

namespace dcf::server {

class ServingState {
 public:
  // `auth` may be null (no API key); neither pointer is owned.
  ServingState(const ServerOptions* options, const ApiKeyChecker* auth, ServerMetrics* metrics)
      : options_(options), auth_(auth), metrics_(metrics), writers_(kWriterThreads) {}

  // Must be called once, before any call can see the engine; `limits` and `info` describe it.
  void PublishEngine(Engine* engine, RequestLimits limits, ServedModelInfo info) {
    limits_ = limits;
    info_ = std::move(info);
    engine_.store(engine, std::memory_order_release);
  }
  void StartDraining() { draining_.store(true); }
  bool draining() const { return draining_.load(); }

  // The engine once published (null before); stays valid until the gRPC server is shut down.
  Engine* engine() const { return engine_.load(std::memory_order_acquire); }
  const RequestLimits& limits() const { return limits_; }
  const ServedModelInfo& info() const { return info_; }
  const ServerOptions& options() const { return *options_; }
  ServerMetrics& metrics() const { return *metrics_; }
  // Where Generate calls build and start their writes (see stream_writer_pool.h). Outlives the
  // gRPC server and the engine: it is destroyed with this object.
  StreamWriterPool& writers() { return writers_; }

  // Checks the API key, then that the engine is up and not draining. OK or the status to
  // fail the call with (UNAUTHENTICATED / UNAVAILABLE).
  grpc::Status Admit(const grpc::CallbackServerContext& context) const;

  // Bookkeeping of Generate streams, so that draining can wait for them.
  void StreamStarted() {
    absl::MutexLock lock(&mu_);
    ++active_streams_;
  }
  void StreamDone() {
    absl::MutexLock lock(&mu_);
    --active_streams_;
  }
  int active_streams() const {
    absl::MutexLock lock(&mu_);
    return active_streams_;
  }
  // Blocks (the main thread only) until no stream is active or `deadline`; true if none is.
  bool AwaitNoStreams(absl::Time deadline) const {
    absl::MutexLock lock(&mu_);
    auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return active_streams_ == 0; };
    return mu_.AwaitWithDeadline(absl::Condition(&none), deadline);
  }

 private:
  // One thread builds the first write of each burst; later writes of busy streams start on
  // gRPC's threads (OnWriteDone), so one is enough to keep the engine loop off the wire.
  static constexpr int kWriterThreads = 1;

  const ServerOptions* options_;
  const ApiKeyChecker* auth_;
  ServerMetrics* metrics_;
  RequestLimits limits_;
  ServedModelInfo info_;
  std::atomic<Engine*> engine_{nullptr};
  std::atomic<bool> draining_{false};
  mutable absl::Mutex mu_;
  int active_streams_ ABSL_GUARDED_BY(mu_) = 0;
  StreamWriterPool writers_;  // last: its threads stop before the rest is destroyed
};

}  // namespace dcf::server
