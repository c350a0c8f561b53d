// One server-streaming Generate call between the engine and its RPC: everything of
// GenerateReactor but the gRPC reactor itself, so that tests can drive it with a fake RPC
// (tests/unit/server/generate_stream_test.cc runs it under ThreadSanitizer).
//
// Flow: Start admits the call (API key, then a slot of --max-open-streams and of
// --max-open-streams-per-peer), parses the request bytes (the service's methods are raw: see
// request_parser.h), validates and enqueues it. When the engine makes output pending, the
// stream's on-ready callback (engine loop thread) only posts the call to the server's
// StreamWriterPool; a writer thread then "pumps": if no write is in flight it takes what is
// pending from the engine's stream, up to kMaxMessageBytes (tokens coalesce while a write is
// in flight), builds and serializes one response and starts its write. OnWriteDone (an RPC
// thread) pumps again. After the final chunk is written the call finishes with OK (or the
// engine's error). OnCancel (client cancel, deadline, broken connection) cancels the engine
// request, which frees its KV blocks.
//
// A client that stops reading holds its write in flight. Two bounds end such a call with
// RESOURCE_EXHAUSTED, cancelling the engine request and the call itself at once (the status
// travels in a HEADERS frame, which HTTP/2 flow control does not hold back): the output
// waiting behind the write passes --max-stream-buffer-bytes, or the write in flight is not done
// by its deadline (ServingState's watchdog): --first-write-timeout for the first message,
// --write-stall-timeout for later ones. Messages are at most kMaxMessageBytes, so the stall
// timeout is a minimum reading rate: kMaxMessageBytes per --write-stall-timeout.
//
// The decisions are GenerateCall's (generate_call.h: the states, events and effects); this
// class feeds it its events under Link::mu and performs the effects after releasing it.
//
// Thread-safety: all mutable state sits behind Link::mu. The RPC's StartWrite, Finish and the
// call's cancel are called without the lock held (gRPC may run reactions inline), and only by
// the thread whose event returned them, so at most one write is in flight and Finish runs
// once. Callbacks from the engine, the writer pool and the watchdog reach the stream through a
// shared Link that OnDone clears, so a late callback never touches a deleted stream; they
// touch the stream after releasing the lock only to start the write or finish they were
// handed (OnDone cannot run before those complete).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/serving/engine.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/status.h"
#include "grpcpp/support/string_ref.h"
#include "server/generate_call.h"
#include "server/serving_state.h"

namespace dcf::server {

class GenerateStream {
 public:
  // The largest message a stream writes (about: RequestStream::pending_bytes counts), unless
  // one engine step alone made more for this request.
  static constexpr size_t kMaxMessageBytes = 16 << 10;

  // The call as the stream sees it: GenerateReactor (gRPC), or a fake in tests.
  class Rpc {
   public:
    virtual ~Rpc() = default;
    virtual const std::multimap<grpc::string_ref, grpc::string_ref>& client_metadata() const = 0;
    virtual std::string peer() const = 0;  // gRPC's form: "ipv4:1.2.3.4:5678"
    virtual absl::Time deadline() const = 0;  // InfiniteFuture when none
    virtual bool IsCancelled() const = 0;
    // Starts writing `message` (valid until the write completes); completion comes as
    // GenerateStream::OnWriteDone, on another thread or inline.
    virtual void StartWrite(const grpc::ByteBuffer* message) = 0;
    // Ends the call with `status`; OnDone follows, on another thread or inline.
    virtual void Finish(const grpc::Status& status) = 0;
    // A closure that cancels the call with `status` (a write in flight then completes,
    // failed), for running after the lock is released; it keeps what it needs alive, so it
    // may run after the call is done. Called under the lock: must not run reactions.
    virtual std::function<void()> PrepareCancel(const grpc::Status& status) = 0;
  };

  // Neither pointer is owned; `rpc` outlives this stream (its owner destroys both after
  // OnDone). Start must follow.
  GenerateStream(ServingState* state, Rpc* rpc);
  ~GenerateStream();

  // Admits, parses and enqueues the request (`request` holds the serialized
  // dcformer.v1.GenerateRequest; invalid when the call carried none), or finishes the call.
  void Start(const grpc::ByteBuffer& request);

  // The RPC's reactions.
  void OnWriteDone(bool ok);
  void OnCancel();
  // Counts and logs the call and unregisters it; the owner then deletes the stream.
  void OnDone();

  // What the state machine decided (for tests; takes the lock).
  GenerateCall::State state() const;
  int violations() const;

 private:
  struct Link : OpenStream {
    void EndIfStalled(int64_t now_ns) override;
    absl::Mutex mu;
    GenerateStream* stream ABSL_GUARDED_BY(mu) = nullptr;
    std::atomic<bool> queued{false};  // a pump task is posted and has not started yet
  };
  // The effects of the events under one hold of the lock, with what performing them needs.
  struct Pending {
    GenerateCall::Effects effects;
    RequestCanceller engine;       // set with effects.cancel_engine
    std::function<void()> cancel;  // set with effects.cancel_call
    grpc::Status finish_status;    // set with io == kFinish
  };

  // Runs on a StreamWriterPool thread whenever the stream has new output.
  static void OnStreamReady(const std::shared_ptr<Link>& link);
  // Performs `pending` after the lock is released. Touches `stream` only for the write or
  // the finish it was handed (so `stream` may be a stream that is gone when there is none);
  // Finish may delete it.
  static void Perform(GenerateStream* stream, Pending pending);

  // Records the effects of one event (and logs a violation of the state machine).
  void Apply(const GenerateCall::Effects& effects, Pending* pending)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(link_->mu);
  // Takes and builds the next message when no write is in flight, or checks the output
  // waiting behind the write in flight against --max-stream-buffer-bytes.
  void Pump(Pending* pending) ABSL_EXCLUSIVE_LOCKS_REQUIRED(link_->mu);
  std::string CancelOutcomeNow() const;
  // Fails the call before anything was enqueued.
  void Reject(const char* outcome, const grpc::Status& status, bool client_ended = false);

  ServingState* const state_;
  Rpc* const rpc_;
  const absl::Time start_time_ = absl::Now();
  const std::shared_ptr<Link> link_;

  bool registered_ = false;  // RegisterStream took a slot (set in Start, read in OnDone)
  RequestHandle handle_;     // set once enqueued; its destructor cancels a live request
  std::string request_id_;   // validated (the engine assigned or accepted it); empty before
  bool with_logprobs_ = false;
  int prompt_tokens_ = 0;

  GenerateCall call_ ABSL_GUARDED_BY(link_->mu);
  grpc::ByteBuffer write_buffer_ ABSL_GUARDED_BY(link_->mu);  // the write in flight
  Timing timing_ ABSL_GUARDED_BY(link_->mu);
  bool have_timing_ ABSL_GUARDED_BY(link_->mu) = false;
  int violations_logged_ ABSL_GUARDED_BY(link_->mu) = 0;
};

}  // namespace dcf::server
