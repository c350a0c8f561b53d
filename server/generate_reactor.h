// One server-streaming Generate call: a gRPC callback reactor fed by the engine.
//
// Flow: the constructor parses the request bytes (the service's methods are raw: see
// request_parser.h), validates and enqueues it. When the engine makes output pending, the
// stream's on-ready callback (engine loop thread) only posts the call to the server's
// StreamWriterPool; a writer thread then "pumps": if no write is in flight, it takes
// everything pending from the stream (tokens coalesce while a write is in flight), builds and
// serializes one response and starts its write. OnWriteDone (gRPC thread) pumps again. After
// the final chunk is written the call finishes with OK (or the engine's error). OnCancel
// (client cancel, deadline, broken connection) cancels the engine request, which frees its KV
// blocks. A client that stops reading holds its write in flight; once the output waiting
// behind it exceeds --max-stream-buffer-bytes the request is cancelled in the engine and the
// call ends with RESOURCE_EXHAUSTED (after that write completes or the connection breaks).
//
// Thread-safety: all mutable state sits behind Link::mu. StartWrite and Finish are called
// without the lock held (gRPC may run reactions inline), and only by the thread that claimed
// the right to do so under the lock, so at most one write is in flight and Finish runs once.
// Callbacks reach the reactor through a shared Link that OnDone clears, so a late callback
// never touches a deleted reactor.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "dcformer/v1/dcformer.grpc.pb.h"
#include "engine/serving/engine.h"
#include "grpcpp/grpcpp.h"
#include "server/serving_state.h"

namespace dcf::server {

class GenerateReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // `request` holds the serialized dcformer.v1.GenerateRequest.
  GenerateReactor(ServingState* state, grpc::CallbackServerContext* context,
                  const grpc::ByteBuffer* request);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  struct Link {
    absl::Mutex mu;
    GenerateReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
    std::atomic<bool> queued{false};  // a pump task is posted and has not started yet
  };
  // What a pump decided to do once the lock is released.
  enum class Action { kNone, kWrite, kFinish };

  ~GenerateReactor() override = default;  // only OnDone deletes

  void Start(const grpc::ByteBuffer& request_bytes);
  // Runs on a StreamWriterPool thread whenever the stream has new output.
  static void OnStreamReady(const std::shared_ptr<Link>& link);
  // Decides the next action; sets *cancel_engine when the engine request must be cancelled
  // (by the caller, without the lock).
  Action Pump(bool* cancel_engine) ABSL_EXCLUSIVE_LOCKS_REQUIRED(link_->mu);
  std::string CancelOutcomeNow() const;
  void Perform(Action action);
  // Fails the call before anything was enqueued.
  void Reject(const grpc::Status& status);

  ServingState* const state_;
  grpc::CallbackServerContext* const context_;
  const absl::Time start_time_ = absl::Now();
  std::shared_ptr<Link> link_;

  RequestHandle handle_;          // set once enqueued; its destructor cancels a live request
  std::string request_id_;
  bool with_logprobs_ = false;
  int prompt_tokens_ = 0;

  grpc::ByteBuffer write_buffer_ ABSL_GUARDED_BY(link_->mu);  // the write in flight
  int tokens_in_flight_ ABSL_GUARDED_BY(link_->mu) = 0;
  bool write_in_flight_ ABSL_GUARDED_BY(link_->mu) = false;
  bool final_written_ ABSL_GUARDED_BY(link_->mu) = false;  // final message started
  bool cancelled_ ABSL_GUARDED_BY(link_->mu) = false;
  bool overflowed_ ABSL_GUARDED_BY(link_->mu) = false;  // the client stopped reading
  bool finish_called_ ABSL_GUARDED_BY(link_->mu) = false;
  grpc::Status finish_status_ ABSL_GUARDED_BY(link_->mu);
  int generated_tokens_ ABSL_GUARDED_BY(link_->mu) = 0;
  std::string outcome_ ABSL_GUARDED_BY(link_->mu);
  Timing timing_ ABSL_GUARDED_BY(link_->mu);
  bool have_timing_ ABSL_GUARDED_BY(link_->mu) = false;
};

}  // namespace dcf::server
