#include "server/generate_call.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace dcf::server {

using Io = GenerateCall::Effects::Io;

const char* GenerateCall::StateName(State s) {
  switch (s) {
    case State::kStarting: return "starting";
    case State::kStreaming: return "streaming";
    case State::kWriting: return "writing";
    case State::kWritingFinal: return "writing_final";
    case State::kEnding: return "ending";
    case State::kFinishing: return "finishing";
  }
  return "?";
}

bool GenerateCall::Allowed(State from, State to) {
  switch (from) {
    case State::kStarting: return to == State::kStreaming || to == State::kFinishing;
    case State::kStreaming:
      return to == State::kWriting || to == State::kWritingFinal || to == State::kFinishing;
    case State::kWriting:
      return to == State::kStreaming || to == State::kEnding || to == State::kFinishing;
    case State::kWritingFinal: return to == State::kFinishing || to == State::kEnding;
    case State::kEnding: return to == State::kFinishing;
    case State::kFinishing: return false;
  }
  return false;
}

void GenerateCall::Become(State next) {
  if (!Allowed(state_, next)) {
    Violation(absl::StrCat("-> ", StateName(next)).c_str());
    return;
  }
  state_ = next;
}

GenerateCall::Effects GenerateCall::Violation(const char* event) {
  if (violations_++ == 0) first_violation_ = absl::StrCat(event, " in state ", StateName(state_));
  return {};
}

GenerateCall::Effects GenerateCall::Reject(std::string outcome, grpc::Status status,
                                           bool client_ended) {
  if (state_ != State::kStarting) return Violation("Reject");
  outcome_ = std::move(outcome);
  status_ = std::move(status);
  client_ended_ = client_ended;
  Become(State::kFinishing);
  Effects e;
  e.io = Io::kFinish;
  return e;
}

GenerateCall::Effects GenerateCall::Enqueued() {
  if (state_ != State::kStarting) return Violation("Enqueued");
  Become(State::kStreaming);
  return {};
}

GenerateCall::Effects GenerateCall::ChunkTaken(int tokens, bool final, std::string outcome,
                                               grpc::Status status) {
  if (state_ != State::kStreaming) return Violation("ChunkTaken");
  tokens_in_flight_ = tokens;
  write_in_flight_ = true;
  if (final) {
    final_outcome_ = std::move(outcome);
    final_status_ = std::move(status);
    Become(State::kWritingFinal);
  } else {
    Become(State::kWriting);
  }
  Effects e;
  e.io = Io::kWrite;
  return e;
}

GenerateCall::Effects GenerateCall::End(std::string outcome, grpc::Status status,
                                        bool cancel_call) {
  outcome_ = std::move(outcome);
  status_ = std::move(status);
  Effects e;
  e.cancel_engine = true;
  if (write_in_flight_) {
    Become(State::kEnding);
    e.cancel_call = cancel_call;
  } else {
    Become(State::kFinishing);
    e.io = Io::kFinish;
  }
  return e;
}

GenerateCall::Effects GenerateCall::EndByClient(const std::string& outcome) {
  client_ended_ = true;
  return End(outcome, grpc::Status::CANCELLED, /*cancel_call=*/false);
}

GenerateCall::Effects GenerateCall::WriteDone(bool ok, const std::string& cancel_outcome) {
  if (!write_in_flight_) return Violation("WriteDone");
  write_in_flight_ = false;
  if (ok) {
    ++messages_written_;
    generated_tokens_ += tokens_in_flight_;
  }
  tokens_in_flight_ = 0;
  switch (state_) {
    case State::kWriting:
      if (ok) {
        Become(State::kStreaming);
        return {};
      }
      return EndByClient(cancel_outcome);  // the stream broke: stop generating for it
    case State::kWritingFinal: {
      if (ok) {
        outcome_ = std::move(final_outcome_);
        status_ = std::move(final_status_);
        Become(State::kFinishing);
        Effects e;
        e.io = Io::kFinish;
        return e;
      }
      // The client never got the final message: it ended the call, whatever the engine said.
      return EndByClient(cancel_outcome);
    }
    case State::kEnding: {
      Become(State::kFinishing);
      Effects e;
      e.io = Io::kFinish;
      return e;
    }
    default:
      return Violation("WriteDone");  // unreachable: write_in_flight_ implies a write state
  }
}

GenerateCall::Effects GenerateCall::Cancelled(const std::string& cancel_outcome) {
  if (cancelled_) return Violation("Cancelled (twice)");
  cancelled_ = true;
  switch (state_) {
    case State::kStarting:
      // gRPC runs reactions only once the handler returned, and Start leaves kStarting.
      return Violation("Cancelled");
    case State::kStreaming:
    case State::kWriting:
    case State::kWritingFinal:  // the final message may never reach the client now
      return EndByClient(cancel_outcome);
    case State::kEnding:
    case State::kFinishing:
      // Ended by the client already (say, a write that failed because the deadline passed):
      // the cancel, seen now, says which it was. Rejected, finished and overflowed calls keep
      // their outcome.
      if (client_ended_) outcome_ = cancel_outcome;
      return {};
  }
  return {};
}

GenerateCall::Effects GenerateCall::OutputPending(size_t pending_bytes, size_t max_pending_bytes) {
  if (state_ != State::kWriting || max_pending_bytes == 0 || pending_bytes <= max_pending_bytes) {
    return {};
  }
  return End("resource_exhausted",
             grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat("the client is not reading its stream: more than ",
                                       max_pending_bytes,
                                       " bytes of output were waiting (--max-stream-buffer-bytes)")),
             /*cancel_call=*/true);
}

GenerateCall::Effects GenerateCall::WriteStalled(absl::Duration timeout, const char* flag) {
  if (state_ != State::kWriting && state_ != State::kWritingFinal) return {};
  return End("resource_exhausted",
             grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat("the client is not reading its stream: ",
                                       messages_written_ == 0 ? "its first message" : "a message",
                                       " was not sent within ", absl::FormatDuration(timeout),
                                       " (", flag, ")")),
             /*cancel_call=*/true);
}

}  // namespace dcf::server
