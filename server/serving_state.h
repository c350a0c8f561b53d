// State shared by the TextGeneration service, its reactors and the process's main loop.
//
// Lifecycle: created before the gRPC server starts with no engine (calls get UNAVAILABLE
// "starting"); PublishEngine() once the model is loaded and warmed up; StartDraining() once
// the drain on SIGTERM is over (calls that still reach the service get UNAVAILABLE again;
// during the drain gRPC itself refuses new calls, and the ones it accepted before are
// served). The engine outlives the gRPC server.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/serving/engine.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/string_ref.h"
#include "server/auth.h"
#include "server/metrics.h"
#include "server/model_info.h"
#include "server/proto_convert.h"
#include "server/server_options.h"
#include "server/stream_writer_pool.h"

namespace dcf::server {

// Now on a monotonic clock, in nanoseconds: what write deadlines are measured in (the wall
// clock may jump).
int64_t SteadyNowNanos();

// What ServingState keeps of an open Generate stream (GenerateStream's link to its stream,
// which outlives it): the drain waits for them, the write-stall watchdog checks them, the
// per-address share of --max-open-streams counts them.
class OpenStream {
 public:
  virtual ~OpenStream() = default;
  // Ends the call (RESOURCE_EXHAUSTED) if its write in flight is still in flight at `now_ns`
  // (SteadyNowNanos) past its deadline. Called without ServingState's lock.
  virtual void EndIfStalled(int64_t now_ns) = 0;

  static constexpr int64_t kNoWrite = INT64_MAX;
  // SteadyNowNanos by which the write in flight must complete; kNoWrite when none is in
  // flight. Written under the stream's own lock, read lock-free by the watchdog's scan.
  std::atomic<int64_t> write_deadline_ns{kNoWrite};
  // The client's address (PeerAddress), set before the stream is registered.
  std::string peer;
};

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
  grpc::Status Admit(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const;
  grpc::Status Admit(const grpc::CallbackServerContext& context) const {
    return Admit(context.client_metadata());
  }
  // RESOURCE_EXHAUSTED when a request message is over --max-receive-message-bytes. gRPC's
  // own limit is kReceiveLimitMargin higher (GrpcReceiveLimit), so that such calls reach the
  // service and are answered, counted and logged like any other; only messages past gRPC's
  // limit are refused by gRPC itself, unseen.
  grpc::Status CheckRequestSize(const grpc::ByteBuffer& request) const;

  // Bookkeeping of Generate streams, so that draining can wait for them, the watchdog can
  // end the stalled ones and --max-open-streams (in all) and --max-open-streams-per-peer (from
  // one client address, stream->peer) bound them. OK and registered, or RESOURCE_EXHAUSTED
  // (nothing registered) when a bound is reached. Only admitted calls get this far: a call
  // refused for its key or its request takes no slot.
  grpc::Status RegisterStream(std::shared_ptr<OpenStream> stream);
  // Unregisters a stream RegisterStream registered (others are ignored).
  void StreamDone(const std::shared_ptr<OpenStream>& stream);
  int active_streams() const {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(streams_.size());
  }
  // Blocks (the main thread only) until no stream is active or `deadline`; true if none is.
  bool AwaitNoStreams(absl::Time deadline) const {
    absl::MutexLock lock(&mu_);
    auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return streams_.empty(); };
    return mu_.AwaitWithDeadline(absl::Condition(&none), deadline);
  }
  // Ends every stream whose write in flight is past its deadline at `now_ns` (SteadyNowNanos):
  // --first-write-timeout for a call's first message, --write-stall-timeout for the others
  // (the client does not read, or reads too little). Returns how many.
  int EndStalledStreams(int64_t now_ns);

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
  std::set<std::shared_ptr<OpenStream>> streams_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> streams_per_peer_ ABSL_GUARDED_BY(mu_);
  StreamWriterPool writers_;  // last: its threads stop before the rest is destroyed
};

}  // namespace dcf::server
