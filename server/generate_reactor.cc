#include "server/generate_reactor.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/logging.h"
#include "grpc/grpc.h"
#include "server/log_text.h"
#include "server/proto_convert.h"
#include "server/request_parser.h"
#include "server/status_util.h"
#include "server/wire.h"

namespace dcf::server {
namespace {

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

}  // namespace

const char* GenerateReactor::StateName(State s) {
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

bool GenerateReactor::Allowed(State from, State to) {
  switch (from) {
    case State::kStarting: return to == State::kStreaming || to == State::kFinishing;
    case State::kStreaming:
      return to == State::kWriting || to == State::kWritingFinal || to == State::kFinishing;
    case State::kWriting: return to == State::kStreaming || to == State::kEnding;
    case State::kWritingFinal: return to == State::kFinishing || to == State::kEnding;
    case State::kEnding: return to == State::kFinishing;
    case State::kFinishing: return false;
  }
  return false;
}

void GenerateReactor::Become(State next) {
  if (!Allowed(state_now_, next)) {
    DCF_LOG(Error) << "GenerateReactor: no transition " << StateName(state_now_) << " -> "
                   << StateName(next);
  }
  state_now_ = next;
}

GenerateReactor::GenerateReactor(ServingState* state, grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request)
    : state_(state), context_(context), link_(std::make_shared<Link>()) {
  {
    absl::MutexLock lock(&link_->mu);
    link_->reactor = this;
  }
  state_->StreamStarted(link_);
  Start(*request);
}

void GenerateReactor::Reject(const char* outcome, const grpc::Status& status) {
  {
    absl::MutexLock lock(&link_->mu);
    outcome_ = outcome;
    finish_status_ = status;
    Become(State::kFinishing);
  }
  Finish(status);
}

void GenerateReactor::Start(const grpc::ByteBuffer& request_bytes) {
  if (grpc::Status admitted = state_->Admit(*context_); !admitted.ok()) {
    Reject(GrpcCodeLabel(admitted.error_code()), admitted);
    return;
  }
  if (absl::Status open = state_->CheckOpenStreams(); !open.ok()) {
    Reject("resource_exhausted", ToGrpcStatus(open));
    return;
  }
  if (!request_bytes.Valid()) {
    // No request message at all (a message of zero bytes is valid: an empty request). Either
    // the client ended the call (cancel or deadline) before gRPC read one, counted like any
    // client-ended call, or it closed its side without sending one.
    const bool ended = context_->IsCancelled() ||
                       absl::FromChrono(context_->deadline()) <= absl::Now();
    if (!ended) {
      Reject("invalid_argument",
             grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the call carried no request message"));
      return;
    }
    const std::string outcome = CancelOutcomeNow();
    {
      absl::MutexLock lock(&link_->mu);
      client_ended_ = true;
    }
    Reject(outcome.c_str(),
           grpc::Status(grpc::StatusCode::CANCELLED, "the call ended before its request arrived"));
    return;
  }
  if (grpc::Status size = state_->CheckRequestSize(request_bytes); !size.ok()) {
    Reject(GrpcCodeLabel(size.error_code()), size);
    return;
  }
  v1::GenerateRequest request;
  if (absl::Status parsed = ParseRequestBytes(ByteBufferToString(request_bytes), &request);
      !parsed.ok()) {
    const grpc::Status status = ToGrpcStatus(parsed);
    Reject(GrpcCodeLabel(status.error_code()), status);
    return;
  }
  absl::StatusOr<GenerationRequest> converted = ToEngineRequest(request, state_->limits());
  if (!converted.ok()) {
    const grpc::Status status = ToGrpcStatus(converted.status());
    Reject(GrpcCodeLabel(status.error_code()), status);
    return;
  }
  with_logprobs_ = converted->output.logprobs;
  prompt_tokens_ = static_cast<int>(converted->prompt_tokens.size());
  absl::StatusOr<RequestHandle> handle = state_->engine()->Enqueue(std::move(*converted));
  if (!handle.ok()) {
    const grpc::Status status = ToGrpcStatus(handle.status());
    Reject(GrpcCodeLabel(status.error_code()), status);
    return;
  }
  handle_ = std::move(*handle);
  // Only the engine-validated id is ever logged (request_validator.h bounds it).
  request_id_ = handle_.stream().id();
  state_->metrics().AddPromptTokens(prompt_tokens_, Protocol::kGrpc);
  {
    absl::MutexLock lock(&link_->mu);
    Become(State::kStreaming);
  }
  // The engine loop only posts the call to the writer pool (once while a post is pending).
  std::shared_ptr<Link> link = link_;
  StreamWriterPool* writers = &state_->writers();
  handle_.stream().SetOnReady([link, writers]() {
    if (link->queued.exchange(true)) return;
    writers->Post([link]() {
      link->queued.store(false);
      OnStreamReady(link);
    });
  });
}

void GenerateReactor::OnStreamReady(const std::shared_ptr<Link>& link) {
  GenerateReactor* reactor;
  Effects effects;
  {
    absl::MutexLock lock(&link->mu);
    reactor = link->reactor;
    if (reactor == nullptr) return;  // the call is already done
    reactor->Pump(&effects);
  }
  // This thread is no gRPC reaction, so nothing keeps the reactor alive once the lock is
  // released unless this pump claimed a write or the finish (OnDone cannot run before those
  // complete); the cancels go through a canceller and a call reference taken under the lock.
  reactor->Perform(std::move(effects));
}

void GenerateReactor::Link::EndIfStalled(absl::Time cutoff) {
  GenerateReactor* r;
  Effects effects;
  {
    absl::MutexLock lock(&mu);
    r = reactor;
    if (r == nullptr) return;
    const bool writing = r->state_now_ == State::kWriting || r->state_now_ == State::kWritingFinal;
    if (!writing || write_started_ns.load() >= absl::ToUnixNanos(cutoff)) return;
    const absl::Duration timeout = r->state_->options().write_stall_timeout;
    r->EndEarly("resource_exhausted",
                grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                             absl::StrCat("the client is not reading its stream: a write made no "
                                          "progress for ", absl::FormatDuration(timeout),
                                          " (--write-stall-timeout)")),
                /*cancel_call=*/true, &effects);
  }
  r->Perform(std::move(effects));
}

void GenerateReactor::Claim(Effects::Io io, Effects* effects) {
  effects->io = io;
}

void GenerateReactor::EndEarly(const char* outcome, const grpc::Status& status, bool cancel_call,
                               Effects* effects) {
  outcome_ = outcome;
  finish_status_ = status;
  if (handle_.shared_stream() != nullptr) effects->cancel_engine = handle_.canceller();
  if (state_now_ == State::kWriting || state_now_ == State::kWritingFinal) {
    Become(State::kEnding);
    if (cancel_call) {
      // The write in flight waits for a client that may never read: cancelling the call
      // sends the status now and completes the write (failed), which then finishes the call.
      effects->cancel_call = context_->c_call();
      grpc_call_ref(effects->cancel_call);
      effects->cancel_status = status;
    }
  } else {
    Become(State::kFinishing);
    Claim(Effects::Io::kFinish, effects);
  }
}

void GenerateReactor::EndByClient(const std::string& outcome, Effects* effects) {
  client_ended_ = true;
  EndEarly(outcome.c_str(), grpc::Status::CANCELLED, /*cancel_call=*/false, effects);
}

void GenerateReactor::Pump(Effects* effects) {
  switch (state_now_) {
    case State::kStarting:
    case State::kWritingFinal:
    case State::kEnding:
    case State::kFinishing:
      return;
    case State::kWriting: {
      // The client reads slower than the engine writes: output coalesces in the stream. Bound
      // it: a client that stopped reading must not hold the engine (or memory) forever.
      const size_t limit = state_->options().max_stream_buffer_bytes;
      if (limit > 0 && handle_.stream().pending_bytes() > limit) {
        EndEarly("resource_exhausted",
                 grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                              absl::StrCat("the client is not reading its stream: more than ",
                                           limit, " bytes of output were waiting "
                                           "(--max-stream-buffer-bytes)")),
                 /*cancel_call=*/true, effects);
      }
      return;
    }
    case State::kStreaming:
      break;
  }
  GenerationChunk chunk;
  if (!handle_.stream().TryTake(&chunk)) return;
  v1::GenerateResponse response;
  ChunkToResponse(chunk, request_id_, with_logprobs_, &response);
  SerializeToByteBuffer(response, &write_buffer_);
  tokens_in_flight_ = static_cast<int>(chunk.tokens.size());
  generated_tokens_ += tokens_in_flight_;
  if (chunk.finished) {
    outcome_ = FinishReasonName(chunk.finish_reason);
    timing_ = chunk.timing;
    have_timing_ = true;
    // Accepted, then failed: INTERNAL with the engine's message, whatever its code.
    finish_status_ = chunk.finish_reason == FinishReason::kError
                         ? AcceptedRequestFailedStatus(chunk.error)
                         : grpc::Status::OK;
    Become(State::kWritingFinal);
  } else {
    Become(State::kWriting);
  }
  link_->write_started_ns.store(absl::ToUnixNanos(absl::Now()));
  Claim(Effects::Io::kWrite, effects);
}

void GenerateReactor::Perform(Effects effects) {
  effects.cancel_engine.Cancel();
  if (effects.cancel_call != nullptr) {
    const std::string message = effects.cancel_status.error_message();
    grpc_call_cancel_with_status(effects.cancel_call,
                                 static_cast<grpc_status_code>(effects.cancel_status.error_code()),
                                 message.c_str(), nullptr);
    grpc_call_unref(effects.cancel_call);
  }
  switch (effects.io) {
    case Effects::Io::kNone:
      return;
    case Effects::Io::kWrite:
      StartWrite(&write_buffer_);
      return;
    case Effects::Io::kFinish: {
      grpc::Status status;
      {
        absl::MutexLock lock(&link_->mu);
        status = finish_status_;
      }
      Finish(status);  // may delete `this` (via OnDone) before returning
      return;
    }
  }
}

std::string GenerateReactor::CancelOutcomeNow() const {
  const auto deadline = context_->deadline();
  const absl::Time server_deadline = deadline == std::chrono::system_clock::time_point::max()
                                         ? absl::InfiniteFuture()
                                         : absl::FromChrono(deadline);
  return ClientCancelOutcome(start_time_, server_deadline, absl::Now());
}

void GenerateReactor::OnWriteDone(bool ok) {
  const std::string cancel_outcome = ok ? std::string() : CancelOutcomeNow();
  Effects effects;
  {
    absl::MutexLock lock(&link_->mu);
    link_->write_started_ns.store(OpenStream::kNoWrite);
    if (ok) state_->metrics().AddGeneratedTokens(tokens_in_flight_);
    tokens_in_flight_ = 0;
    switch (state_now_) {
      case State::kWriting:
        Become(State::kStreaming);
        if (ok) {
          Pump(&effects);
        } else {
          EndByClient(cancel_outcome, &effects);  // the stream broke: stop generating for it
        }
        break;
      case State::kWritingFinal:
      case State::kEnding:
        Become(State::kFinishing);
        Claim(Effects::Io::kFinish, &effects);
        break;
      default:
        DCF_LOG(Error) << "GenerateReactor: write done in state " << StateName(state_now_);
        break;
    }
  }
  Perform(std::move(effects));
}

void GenerateReactor::OnCancel() {
  const std::string cancel_outcome = CancelOutcomeNow();
  Effects effects;
  {
    absl::MutexLock lock(&link_->mu);
    switch (state_now_) {
      case State::kStreaming:
      case State::kWriting:
        EndByClient(cancel_outcome, &effects);
        break;
      case State::kEnding:
      case State::kFinishing:
        // Ended by the client already (say, a write that failed because the deadline passed):
        // the cancel, seen now, says which it was. Rejected, finished and overflowed calls
        // keep their outcome.
        if (client_ended_) outcome_ = cancel_outcome;
        break;
      case State::kStarting:
      case State::kWritingFinal:
        break;  // the final message's outcome stands
    }
  }
  Perform(std::move(effects));
}

void GenerateReactor::OnDone() {
  std::string outcome;
  int generated;
  Timing timing;
  bool have_timing;
  {
    absl::MutexLock lock(&link_->mu);
    link_->reactor = nullptr;  // late engine callbacks now do nothing
    outcome = outcome_.empty() ? "cancelled" : outcome_;
    generated = generated_tokens_;
    timing = timing_;
    have_timing = have_timing_;
  }
  state_->metrics().RecordRequest(outcome);
  // One structured line per request. Never the prompt text or the API key; the id only once
  // the engine validated it, and quoted when it holds more than [A-Za-z0-9._:/@+-].
  DCF_LOG(Info) << "request id=" << (request_id_.empty() ? "-" : LogValue(request_id_))
                << " outcome=" << outcome << " prompt_tokens=" << prompt_tokens_
                << " generated_tokens=" << generated
                << " queue_ms=" << (have_timing ? Ms(timing.queue_time) : -1)
                << " ttft_ms=" << (have_timing ? Ms(timing.time_to_first_token) : -1)
                << " total_ms=" << Ms(absl::Now() - start_time_);
  handle_ = RequestHandle();  // cancels the engine request if it is somehow still live
  state_->StreamDone(link_);
  delete this;
}

}  // namespace dcf::server
