#include "server/generate_reactor.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/logging.h"
#include "server/proto_convert.h"
#include "server/request_parser.h"
#include "server/status_util.h"
#include "server/wire.h"

namespace dcf::server {
namespace {

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

}  // namespace

GenerateReactor::GenerateReactor(ServingState* state, grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request)
    : state_(state), context_(context), link_(std::make_shared<Link>()) {
  {
    absl::MutexLock lock(&link_->mu);
    link_->reactor = this;
  }
  state_->StreamStarted();
  Start(*request);
}

void GenerateReactor::Reject(const grpc::Status& status) {
  {
    absl::MutexLock lock(&link_->mu);
    outcome_ = GrpcCodeLabel(status.error_code());
    finish_called_ = true;
  }
  Finish(status);
}

void GenerateReactor::Start(const grpc::ByteBuffer& request_bytes) {
  if (grpc::Status admitted = state_->Admit(*context_); !admitted.ok()) {
    Reject(admitted);
    return;
  }
  if (!request_bytes.Valid()) {
    // No request message at all (a message of zero bytes is valid: an empty request). Either
    // the client ended the call (cancel or deadline) before gRPC read one, counted like any
    // client-ended call, or it closed its side without sending one.
    const bool ended = context_->IsCancelled() ||
                       absl::FromChrono(context_->deadline()) <= absl::Now();
    if (!ended) {
      Reject(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the call carried no request message"));
      return;
    }
    {
      absl::MutexLock lock(&link_->mu);
      outcome_ = CancelOutcomeNow();
      finish_called_ = true;
    }
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the call ended before its request arrived"));
    return;
  }
  v1::GenerateRequest request;
  if (absl::Status parsed = ParseRequestBytes(ByteBufferToString(request_bytes), &request);
      !parsed.ok()) {
    Reject(ToGrpcStatus(parsed));
    return;
  }
  request_id_ = request.request_id();
  absl::StatusOr<GenerationRequest> converted = ToEngineRequest(request, state_->limits());
  if (!converted.ok()) {
    Reject(ToGrpcStatus(converted.status()));
    return;
  }
  with_logprobs_ = converted->output.logprobs;
  prompt_tokens_ = static_cast<int>(converted->prompt_tokens.size());
  absl::StatusOr<RequestHandle> handle = state_->engine()->Enqueue(std::move(*converted));
  if (!handle.ok()) {
    Reject(ToGrpcStatus(handle.status()));
    return;
  }
  handle_ = std::move(*handle);
  request_id_ = handle_.stream().id();
  state_->metrics().AddPromptTokens(prompt_tokens_);
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
  Action action;
  bool cancel_engine = false;
  RequestCanceller canceller;
  {
    absl::MutexLock lock(&link->mu);
    reactor = link->reactor;
    if (reactor == nullptr) return;  // the call is already done
    action = reactor->Pump(&cancel_engine);
    if (cancel_engine) canceller = reactor->handle_.canceller();
  }
  // This thread is no gRPC reaction, so nothing keeps the reactor alive once the lock is
  // released unless this pump claimed a write or the finish (OnDone cannot run before those
  // complete). The engine cancel therefore goes through a canceller taken under the lock.
  canceller.Cancel();
  if (action != Action::kNone) reactor->Perform(action);
}

GenerateReactor::Action GenerateReactor::Pump(bool* cancel_engine) {
  if (finish_called_) return Action::kNone;
  if (write_in_flight_) {
    // The client reads slower than the engine writes: output coalesces in the stream. Bound
    // it: a client that stopped reading must not hold the engine (or memory) forever.
    const size_t limit = state_->options().max_stream_buffer_bytes;
    if (!cancelled_ && !final_written_ && handle_.shared_stream() != nullptr && limit > 0 &&
        handle_.stream().pending_bytes() > limit) {
      cancelled_ = true;
      overflowed_ = true;
      *cancel_engine = true;
      outcome_ = "resource_exhausted";
      finish_status_ = grpc::Status(
          grpc::StatusCode::RESOURCE_EXHAUSTED,
          absl::StrCat("the client is not reading its stream: more than ", limit,
                       " bytes of output were waiting (--max-stream-buffer-bytes)"));
    }
    return Action::kNone;
  }
  if (cancelled_ || final_written_) {
    finish_called_ = true;
    if (cancelled_ && !final_written_ && !overflowed_) finish_status_ = grpc::Status::CANCELLED;
    return Action::kFinish;
  }
  if (handle_.shared_stream() == nullptr) return Action::kNone;
  GenerationChunk chunk;
  if (!handle_.stream().TryTake(&chunk)) return Action::kNone;
  v1::GenerateResponse response;
  ChunkToResponse(chunk, request_id_, with_logprobs_, &response);
  SerializeToByteBuffer(response, &write_buffer_);
  tokens_in_flight_ = static_cast<int>(chunk.tokens.size());
  generated_tokens_ += tokens_in_flight_;
  if (chunk.finished) {
    final_written_ = true;
    outcome_ = FinishReasonName(chunk.finish_reason);
    timing_ = chunk.timing;
    have_timing_ = true;
    if (chunk.finish_reason == FinishReason::kError) {
      // Accepted, then failed: INTERNAL with the engine's message, whatever its code.
      finish_status_ = AcceptedRequestFailedStatus(chunk.error);
    } else {
      finish_status_ = grpc::Status::OK;
    }
  }
  write_in_flight_ = true;
  return Action::kWrite;
}

void GenerateReactor::Perform(Action action) {
  switch (action) {
    case Action::kNone:
      return;
    case Action::kWrite:
      StartWrite(&write_buffer_);
      return;
    case Action::kFinish: {
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
  bool cancel_engine = false;
  Action action;
  {
    absl::MutexLock lock(&link_->mu);
    write_in_flight_ = false;
    if (ok) {
      state_->metrics().AddGeneratedTokens(tokens_in_flight_);
    } else if (!final_written_ && !cancelled_) {
      // The stream broke (client gone): stop generating for it.
      cancelled_ = true;
      cancel_engine = true;
      if (outcome_.empty()) outcome_ = CancelOutcomeNow();
    }
    tokens_in_flight_ = 0;
    action = Pump(&cancel_engine);
  }
  if (cancel_engine && handle_.shared_stream()) handle_.Cancel();
  Perform(action);
}

void GenerateReactor::OnCancel() {
  const std::string cancel_outcome = CancelOutcomeNow();
  Action action;
  bool cancel_engine = false;
  {
    absl::MutexLock lock(&link_->mu);
    cancelled_ = true;
    // A rejected call keeps its status as outcome, a finished one its finish reason, an
    // overflowed one resource_exhausted. This also overrides a "cancelled" set by a failed
    // write that the deadline caused.
    if (!final_written_ && !overflowed_ && handle_.shared_stream()) outcome_ = cancel_outcome;
    action = Pump(&cancel_engine);
  }
  if (handle_.shared_stream()) handle_.Cancel();  // frees the KV blocks within one step
  Perform(action);
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
  // One structured line per request. Never the prompt text or the API key.
  DCF_LOG(Info) << "request id=" << (request_id_.empty() ? "-" : request_id_)
                << " outcome=" << outcome << " prompt_tokens=" << prompt_tokens_
                << " generated_tokens=" << generated
                << " queue_ms=" << (have_timing ? Ms(timing.queue_time) : -1)
                << " ttft_ms=" << (have_timing ? Ms(timing.time_to_first_token) : -1)
                << " total_ms=" << Ms(absl::Now() - start_time_);
  handle_ = RequestHandle();  // cancels the engine request if it is somehow still live
  state_->StreamDone();
  delete this;
}

}  // namespace dcf::server
