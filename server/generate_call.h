// The life of one Generate call as a pure state machine: events in, effects out. No gRPC
// call, no engine, no lock and no clock: GenerateReactor feeds it the events of its call (under
// its own lock) and performs the effects it returns (after releasing the lock), and the unit
// tests drive every event in every state (tests/unit/server/generate_call_test.cc).
//
// States and the events that move them (every change goes through Become, which allows only
// these; Allowed() is this table):
//
//   kStarting     --Enqueued--> kStreaming       --Reject--> kFinishing
//   kStreaming    --ChunkTaken--> kWriting       --ChunkTaken(final)--> kWritingFinal
//                 --Cancelled--> kFinishing
//   kWriting      --WriteDone(ok)--> kStreaming  --WriteDone(failed)--> kFinishing
//                 --Cancelled, OutputPending past the limit, WriteStalled--> kEnding
//   kWritingFinal --WriteDone(ok or failed)--> kFinishing
//                 --Cancelled, WriteStalled--> kEnding
//   kEnding       --WriteDone(ok or failed)--> kFinishing
//   kFinishing    (Finish was returned: OnDone follows; nothing moves it)
//
// The rules the findings of docs/API.md's "Security" section rest on:
// - At most one write is in flight, and the finish is returned exactly once, never while a
//   write is in flight (kEnding waits for the write to complete: gRPC completes it at once
//   when the call is cancelled).
// - Tokens count as generated when their write completes (WriteDone(ok)), not when taken.
// - A call the client ends (a failed write, a cancel) is counted with the client's outcome,
//   even when the final message was being written: the client never got it.
// - The outcome (a finish reason or a gRPC code label) and the status are set with the
//   transition that decides them; a client-ended outcome may still be refined by a late
//   Cancelled (it tells a deadline from a cancel).
//
// An event the state does not allow (say WriteDone with no write in flight) changes nothing,
// returns no effect and is counted in violations(): the reactor logs it, the tests fail on it.
//
// Thread-safety: none; the owner serializes the calls.
#pragma once

#include <cstddef>
#include <string>

#include "absl/time/time.h"
#include "grpcpp/support/status.h"

namespace dcf::server {

class GenerateCall {
 public:
  enum class State {
    kStarting,      // admitting, parsing and enqueueing the request
    kStreaming,     // enqueued, no write in flight
    kWriting,       // a chunk's write is in flight
    kWritingFinal,  // the final chunk's write is in flight
    kEnding,        // ended early while a write was in flight: finishes when it completes
    kFinishing,     // Finish returned; OnDone follows
  };
  static const char* StateName(State s);
  // The transitions of the diagram above.
  static bool Allowed(State from, State to);

  // What the owner does once its lock is released, in this order.
  struct Effects {
    bool cancel_engine = false;  // cancel the engine request (frees its KV blocks)
    bool cancel_call = false;    // cancel the gRPC call with status(): a write in flight to a
                                 // client that does not read then completes (failed) at once
    enum class Io { kNone, kWrite, kFinish } io = Io::kNone;  // start the taken chunk's write,
                                                              // or Finish(status())
    bool operator==(const Effects& o) const {
      return cancel_engine == o.cancel_engine && cancel_call == o.cancel_call && io == o.io;
    }
  };

  // --- events ---
  // The call is refused before anything was enqueued (`client_ended`: by the client, which
  // ended it before its request arrived). kStarting -> kFinishing.
  Effects Reject(std::string outcome, grpc::Status status, bool client_ended = false);
  // The engine accepted the request. kStarting -> kStreaming.
  Effects Enqueued();
  // True in kStreaming: the owner may take a chunk from the engine's stream and report it.
  bool ready_for_chunk() const { return state_ == State::kStreaming; }
  // A chunk of `tokens` tokens was taken and its message built; `final` when it is the last
  // one, with the call's `outcome` (a finish reason) and `status`. kStreaming -> kWriting or
  // kWritingFinal; returns the write.
  Effects ChunkTaken(int tokens, bool final, std::string outcome = {}, grpc::Status status = {});
  // The write in flight completed (`ok`: the message went out). When it failed the client is
  // gone; `cancel_outcome` says how to count that (ClientCancelOutcome).
  Effects WriteDone(bool ok, const std::string& cancel_outcome);
  // gRPC's OnCancel: the client cancelled, its deadline passed or the connection broke.
  // Legal in any state after Start, once.
  Effects Cancelled(const std::string& cancel_outcome);
  // Output the client has not read piles up behind the write in flight: `pending_bytes` of it
  // against the limit `max_pending_bytes` (--max-stream-buffer-bytes; 0 = none). Past it the
  // call ends RESOURCE_EXHAUSTED. A no-op unless a chunk's write is in flight.
  Effects OutputPending(size_t pending_bytes, size_t max_pending_bytes);
  // The watchdog found the write in flight older than `timeout` (the first message's shorter
  // bound or --write-stall-timeout, named by `flag`): RESOURCE_EXHAUSTED. A no-op unless a
  // write is in flight (it may have completed since the watchdog looked).
  Effects WriteStalled(absl::Duration timeout, const char* flag);

  // --- what the events decided ---
  State state() const { return state_; }
  bool writing() const { return write_in_flight_; }
  // Messages whose write completed (ok).
  int messages_written() const { return messages_written_; }
  // Tokens whose write completed: what the client was sent.
  int generated_tokens() const { return generated_tokens_; }
  // The outcome to count and log ("cancelled" until one is decided).
  const std::string& outcome() const { return outcome_; }
  // The status Finish is to be called with (and the cancel's, with cancel_call).
  const grpc::Status& status() const { return status_; }
  bool client_ended() const { return client_ended_; }
  int violations() const { return violations_; }
  const std::string& first_violation() const { return first_violation_; }

 private:
  void Become(State next);
  // Records an event the state does not allow.
  Effects Violation(const char* event);
  // Ends the call with `status` (counted as `outcome`), cancelling the engine request; with a
  // write in flight it waits in kEnding for the write (cancelling the call when asked).
  Effects End(std::string outcome, grpc::Status status, bool cancel_call);
  Effects EndByClient(const std::string& outcome);

  State state_ = State::kStarting;
  bool write_in_flight_ = false;
  bool cancelled_ = false;  // Cancelled was seen
  bool client_ended_ = false;
  int tokens_in_flight_ = 0;
  int messages_written_ = 0;
  int generated_tokens_ = 0;
  // The final chunk's outcome and status, in force once its write completes.
  std::string final_outcome_;
  grpc::Status final_status_;
  std::string outcome_ = "cancelled";
  grpc::Status status_;
  int violations_ = 0;
  std::string first_violation_;
};

}  // namespace dcf::server
