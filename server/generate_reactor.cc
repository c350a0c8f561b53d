#include "server/generate_reactor.h"

#include <chrono>
#include <utility>

#include "engine/common/logging.h"
#include "server/proto_convert.h"
#include "server/status_util.h"

namespace dcf::server {
namespace {

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

}  // namespace

GenerateReactor::GenerateReactor(ServingState* state, grpc::CallbackServerContext* context,
                                 const v1::GenerateRequest* request)
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

void GenerateReactor::Start(const v1::GenerateRequest& request) {
  request_id_ = request.request_id();
  if (grpc::Status admitted = state_->Admit(*context_); !admitted.ok()) {
    Reject(admitted);
    return;
  }
  Engine* engine = state_->engine();
  absl::StatusOr<GenerationRequest> converted = ToEngineRequest(request, state_->limits());
  if (!converted.ok()) {
    Reject(ToGrpcStatus(converted.status()));
    return;
  }
  with_logprobs_ = converted->output.logprobs;
  prompt_tokens_ = static_cast<int>(converted->prompt_tokens.size());
  absl::StatusOr<RequestHandle> handle = engine->Enqueue(std::move(*converted));
  if (!handle.ok()) {
    Reject(ToGrpcStatus(handle.status()));
    return;
  }
  handle_ = std::move(*handle);
  request_id_ = handle_.stream().id();
  state_->metrics().AddPromptTokens(prompt_tokens_);
  // May run OnStreamReady right here when output is already pending; that is fine: starting
  // a write from the reactor's constructor is allowed by the callback API.
  std::shared_ptr<Link> link = link_;
  handle_.stream().SetOnReady([link]() { OnStreamReady(link); });
}

void GenerateReactor::OnStreamReady(const std::shared_ptr<Link>& link) {
  GenerateReactor* reactor;
  Action action;
  {
    absl::MutexLock lock(&link->mu);
    reactor = link->reactor;
    if (reactor == nullptr) return;  // the call is already done
    action = reactor->Pump();
  }
  // Safe without the lock: a claimed write or finish keeps the reactor alive until its
  // completion (OnDone cannot run before Finish, and Finish waits for the write).
  reactor->Perform(action);
}

GenerateReactor::Action GenerateReactor::Pump() {
  if (finish_called_ || write_in_flight_) return Action::kNone;
  if (cancelled_ || final_written_) {
    finish_called_ = true;
    if (cancelled_ && !final_written_) finish_status_ = grpc::Status::CANCELLED;
    return Action::kFinish;
  }
  if (!handle_.shared_stream()) return Action::kNone;
  GenerationChunk chunk;
  if (!handle_.stream().TryTake(&chunk)) return Action::kNone;
  ChunkToResponse(chunk, request_id_, with_logprobs_, &response_);
  generated_tokens_ += static_cast<int>(chunk.tokens.size());
  if (chunk.finished) {
    final_written_ = true;
    outcome_ = FinishReasonLabel(chunk.finish_reason);
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
      StartWrite(&response_);
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

std::string GenerateReactor::CancelOutcome() const {
  // gRPC does not say why a call ended. A cancel at its deadline is its expiry; the slack
  // covers the server's deadline timer firing a hair before the system clock reaches the
  // deadline (they run on different clocks).
  constexpr auto kSlack = std::chrono::milliseconds(50);
  const auto deadline = context_->deadline();
  if (deadline != std::chrono::system_clock::time_point::max() &&
      deadline <= std::chrono::system_clock::now() + kSlack) {
    return "deadline_exceeded";
  }
  return "cancelled";
}

void GenerateReactor::OnWriteDone(bool ok) {
  bool cancel_engine = false;
  Action action;
  {
    absl::MutexLock lock(&link_->mu);
    write_in_flight_ = false;
    if (ok) {
      state_->metrics().AddGeneratedTokens(response_.token_ids_size());
    } else if (!final_written_ && !cancelled_) {
      // The stream broke (client gone): stop generating for it.
      cancelled_ = true;
      cancel_engine = true;
      if (outcome_.empty()) outcome_ = CancelOutcome();
    }
    action = Pump();
  }
  if (cancel_engine && handle_.shared_stream()) handle_.Cancel();
  Perform(action);
}

void GenerateReactor::OnCancel() {
  const std::string cancel_outcome = CancelOutcome();
  Action action;
  {
    absl::MutexLock lock(&link_->mu);
    cancelled_ = true;
    // A rejected call keeps its status as outcome; a finished one its finish reason. This
    // also overrides a "cancelled" set by a failed write that the deadline caused.
    if (!final_written_ && handle_.shared_stream()) outcome_ = cancel_outcome;
    action = Pump();
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
