// One server-streaming Generate call: a gRPC callback reactor fed by the engine.
//
// Flow: the constructor admits the call (API key, open-stream cap), parses the request bytes
// (the service's methods are raw: see request_parser.h), validates and enqueues it. When the
// engine makes output pending, the stream's on-ready callback (engine loop thread) only posts
// the call to the server's StreamWriterPool; a writer thread then "pumps": if no write is in
// flight, it takes everything pending from the stream (tokens coalesce while a write is in
// flight), builds and serializes one response and starts its write. OnWriteDone (gRPC thread)
// pumps again. After the final chunk is written the call finishes with OK (or the engine's
// error). OnCancel (client cancel, deadline, broken connection) cancels the engine request,
// which frees its KV blocks.
//
// A client that stops reading holds its write in flight. Two bounds end such a call with
// RESOURCE_EXHAUSTED, cancelling the engine request and the call itself at once (the status
// travels in a HEADERS frame, which HTTP/2 flow control does not hold back): the output
// waiting behind the write passes --max-stream-buffer-bytes, or the write in flight makes no
// progress for --write-stall-timeout (ServingState's watchdog, which also covers a final
// message that never leaves).
//
// States (State below; every change goes through Become(), which checks it is allowed):
//
//   kStarting --enqueued--> kStreaming <--write done-- kWriting
//       |                    |  |  '------chunk taken------^  |
//       |                    |  '--final chunk--> kWritingFinal --write done--.
//       |  rejected          |  client gone                 |  client gone,   |
//       v                    v                              v  overflow, stall|
//   kFinishing <---------------------------------------- kEnding --write done-'
//       | (Finish called: OnDone follows)                    (kWritingFinal also --stall-->)
//
// The outcome (a finish reason or a gRPC code label, counted in dcformer_requests_total and
// logged) and the call's status are set with the transition that decides them.
//
// Thread-safety: all mutable state sits behind Link::mu. StartWrite, Finish and the call's
// cancel are called without the lock held (gRPC may run reactions inline), and only by the
// thread that claimed the right to do so under the lock, so at most one write is in flight
// and Finish runs once. Callbacks reach the reactor through a shared Link that OnDone clears,
// so a late callback never touches a deleted reactor.
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

  enum class State {
    kStarting,      // admitting, parsing and enqueueing the request
    kStreaming,     // enqueued, no write in flight
    kWriting,       // a chunk's write is in flight
    kWritingFinal,  // the final chunk's write is in flight
    kEnding,        // ended early while a write was in flight: finishes when it completes
    kFinishing,     // Finish() called; OnDone follows
  };
  static const char* StateName(State s);
  // The transitions the diagram in the header comment allows.
  static bool Allowed(State from, State to);

 private:
  struct Link : OpenStream {
    void EndIfStalled(absl::Time cutoff) override;
    absl::Mutex mu;
    GenerateReactor* reactor ABSL_GUARDED_BY(mu) = nullptr;
    std::atomic<bool> queued{false};  // a pump task is posted and has not started yet
  };
  // What a decision under the lock leaves to do once it is released, in this order.
  struct Effects {
    RequestCanceller cancel_engine;  // empty: nothing to cancel
    grpc_call* cancel_call = nullptr;  // referenced; cancelled with cancel_status, then unref'd
    grpc::Status cancel_status;
    enum class Io { kNone, kWrite, kFinish } io = Io::kNone;
  };

  ~GenerateReactor() override = default;  // only OnDone deletes

  void Start(const grpc::ByteBuffer& request_bytes);
  // Runs on a StreamWriterPool thread whenever the stream has new output.
  static void OnStreamReady(const std::shared_ptr<Link>& link);

  void Become(State next) ABSL_EXCLUSIVE_LOCKS_REQUIRED(link_->mu);
  // Takes the next chunk when no write is in flight, finishes an ended call, or ends one whose
  // client stopped reading.
  void Pump(Effects* effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(link_->mu);
  // Ends the call early with `status` (counted as `outcome`): the engine request and, when a
  // write is in flight, the call itself are cancelled (the write then completes at once).
  void EndEarly(const char* outcome, const grpc::Status& status, bool cancel_call,
                Effects* effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(link_->mu);
  // The client ended the call (cancel, deadline, broken stream), counted as `outcome`.
  void EndByClient(const std::string& outcome, Effects* effects)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(link_->mu);
  void Claim(Effects::Io io, Effects* effects) ABSL_EXCLUSIVE_LOCKS_REQUIRED(link_->mu);
  // Runs the effects; may delete `this` (via Finish -> OnDone) when it finishes the call.
  void Perform(Effects effects);
  std::string CancelOutcomeNow() const;
  // Fails the call before anything was enqueued.
  void Reject(const char* outcome, const grpc::Status& status);

  ServingState* const state_;
  grpc::CallbackServerContext* const context_;
  const absl::Time start_time_ = absl::Now();
  const std::shared_ptr<Link> link_;

  RequestHandle handle_;   // set once enqueued; its destructor cancels a live request
  std::string request_id_;  // validated (the engine assigned or accepted it); empty before
  bool with_logprobs_ = false;
  int prompt_tokens_ = 0;

  State state_now_ ABSL_GUARDED_BY(link_->mu) = State::kStarting;
  bool client_ended_ ABSL_GUARDED_BY(link_->mu) = false;  // outcome is a client cancel's
  grpc::ByteBuffer write_buffer_ ABSL_GUARDED_BY(link_->mu);  // the write in flight
  int tokens_in_flight_ ABSL_GUARDED_BY(link_->mu) = 0;
  grpc::Status finish_status_ ABSL_GUARDED_BY(link_->mu);
  std::string outcome_ ABSL_GUARDED_BY(link_->mu);
  int generated_tokens_ ABSL_GUARDED_BY(link_->mu) = 0;
  Timing timing_ ABSL_GUARDED_BY(link_->mu);
  bool have_timing_ ABSL_GUARDED_BY(link_->mu) = false;
};

}  // namespace dcf::server
