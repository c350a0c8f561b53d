#include "server/generate_stream.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/common/logging.h"
#include "server/log_text.h"
#include "server/peer_address.h"
#include "server/proto_convert.h"
#include "server/request_parser.h"
#include "server/status_util.h"
#include "server/wire.h"

namespace dcf::server {
namespace {

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

}  // namespace

GenerateStream::GenerateStream(ServingState* state, Rpc* rpc)
    : state_(state), rpc_(rpc), link_(std::make_shared<Link>()) {
  absl::MutexLock lock(&link_->mu);
  link_->stream = this;
}

GenerateStream::~GenerateStream() = default;

GenerateCall::State GenerateStream::state() const {
  absl::MutexLock lock(&link_->mu);
  return call_.state();
}

int GenerateStream::violations() const {
  absl::MutexLock lock(&link_->mu);
  return call_.violations();
}

void GenerateStream::Apply(const GenerateCall::Effects& effects, Pending* pending) {
  if (call_.violations() > violations_logged_) {
    // A bug (the tests fail on it): the event was ignored, the call goes on as it was.
    violations_logged_ = call_.violations();
    DCF_LOG(Error) << "GenerateStream: " << call_.first_violation() << " ("
                   << violations_logged_ << " event(s) its state does not allow)";
  }
  if (effects.cancel_engine && handle_.shared_stream() != nullptr) {
    pending->engine = handle_.canceller();
  }
  if (effects.cancel_call) pending->cancel = rpc_->PrepareCancel(call_.status());
  if (effects.io == GenerateCall::Effects::Io::kFinish) pending->finish_status = call_.status();
  pending->effects.cancel_engine |= effects.cancel_engine;
  pending->effects.cancel_call |= effects.cancel_call;
  if (effects.io != GenerateCall::Effects::Io::kNone) pending->effects.io = effects.io;
}

void GenerateStream::Reject(const char* outcome, const grpc::Status& status, bool client_ended) {
  Pending pending;
  {
    absl::MutexLock lock(&link_->mu);
    Apply(call_.Reject(outcome, status, client_ended), &pending);
  }
  Perform(this, std::move(pending));
}

void GenerateStream::Start(const grpc::ByteBuffer& request_bytes) {
  if (grpc::Status admitted = state_->Admit(rpc_->client_metadata()); !admitted.ok()) {
    Reject(GrpcCodeLabel(admitted.error_code()), admitted);
    return;
  }
  link_->peer = PeerAddress(rpc_->peer());
  if (grpc::Status slot = state_->RegisterStream(link_); !slot.ok()) {
    Reject("resource_exhausted", slot);
    return;
  }
  registered_ = true;
  if (!request_bytes.Valid()) {
    // No request message at all (a message of zero bytes is valid: an empty request). Either
    // the client ended the call (cancel or deadline) before gRPC read one, counted like any
    // client-ended call, or it closed its side without sending one.
    const bool ended = rpc_->IsCancelled() || rpc_->deadline() <= absl::Now();
    if (!ended) {
      Reject("invalid_argument",
             grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the call carried no request message"));
      return;
    }
    Reject(CancelOutcomeNow().c_str(),
           grpc::Status(grpc::StatusCode::CANCELLED, "the call ended before its request arrived"),
           /*client_ended=*/true);
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
  state_->metrics().AddPromptTokens(prompt_tokens_);
  {
    absl::MutexLock lock(&link_->mu);
    Pending none;
    Apply(call_.Enqueued(), &none);
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

void GenerateStream::OnStreamReady(const std::shared_ptr<Link>& link) {
  GenerateStream* stream;
  Pending pending;
  {
    absl::MutexLock lock(&link->mu);
    stream = link->stream;
    if (stream == nullptr) return;  // the call is already done
    stream->Pump(&pending);
  }
  // Nothing keeps the stream alive once the lock is released unless this pump was handed a
  // write or the finish (OnDone cannot run before those complete): Perform touches it only
  // then. The cancels go through a canceller and a call reference taken under the lock.
  Perform(stream, std::move(pending));
}

void GenerateStream::Link::EndIfStalled(int64_t now_ns) {
  GenerateStream* s;
  Pending pending;
  {
    absl::MutexLock lock(&mu);
    s = stream;
    if (s == nullptr || write_deadline_ns.load() >= now_ns) return;
    const ServerOptions& options = s->state_->options();
    const bool first = s->call_.messages_written() == 0;
    const absl::Duration timeout =
        first ? std::min(options.first_write_timeout, options.write_stall_timeout)
              : options.write_stall_timeout;
    const char* flag = first && options.first_write_timeout < options.write_stall_timeout
                           ? "--first-write-timeout"
                           : "--write-stall-timeout";
    s->Apply(s->call_.WriteStalled(timeout, flag), &pending);
  }
  Perform(s, std::move(pending));
}

void GenerateStream::Pump(Pending* pending) {
  if (!call_.ready_for_chunk()) {
    // The client reads slower than the engine writes: output coalesces in the stream. Bound
    // it: a client that stopped reading must not hold the engine (or memory) forever.
    Apply(call_.OutputPending(handle_.stream().pending_bytes(),
                              static_cast<size_t>(state_->options().max_stream_buffer_bytes)),
          pending);
    return;
  }
  GenerationChunk chunk;
  if (!handle_.stream().TryTake(&chunk, kMaxMessageBytes)) return;
  v1::GenerateResponse response;
  ChunkToResponse(chunk, request_id_, with_logprobs_, &response);
  SerializeToByteBuffer(response, &write_buffer_);
  const int tokens = static_cast<int>(chunk.tokens.size());
  if (chunk.finished) {
    timing_ = chunk.timing;
    have_timing_ = true;
    // Accepted, then failed: INTERNAL with the engine's message, whatever its code.
    Apply(call_.ChunkTaken(tokens, /*final=*/true, FinishReasonName(chunk.finish_reason),
                           chunk.finish_reason == FinishReason::kError
                               ? AcceptedRequestFailedStatus(chunk.error)
                               : grpc::Status::OK),
          pending);
  } else {
    Apply(call_.ChunkTaken(tokens, /*final=*/false), pending);
  }
  const ServerOptions& options = state_->options();
  const absl::Duration timeout =
      call_.messages_written() == 0
          ? std::min(options.first_write_timeout, options.write_stall_timeout)
          : options.write_stall_timeout;
  link_->write_deadline_ns.store(SteadyNowNanos() + absl::ToInt64Nanoseconds(timeout));
}

void GenerateStream::Perform(GenerateStream* stream, Pending pending) {
  if (pending.effects.cancel_engine) pending.engine.Cancel();
  if (pending.cancel) pending.cancel();
  switch (pending.effects.io) {
    case GenerateCall::Effects::Io::kNone:
      return;
    case GenerateCall::Effects::Io::kWrite:
      // write_buffer_ is not touched again until this write completes.
      stream->rpc_->StartWrite(&stream->write_buffer_);
      return;
    case GenerateCall::Effects::Io::kFinish:
      stream->rpc_->Finish(pending.finish_status);  // may delete `stream` before returning
      return;
  }
}

std::string GenerateStream::CancelOutcomeNow() const {
  return ClientCancelOutcome(start_time_, rpc_->deadline(), absl::Now());
}

void GenerateStream::OnWriteDone(bool ok) {
  const std::string cancel_outcome = ok ? std::string() : CancelOutcomeNow();
  Pending pending;
  {
    absl::MutexLock lock(&link_->mu);
    link_->write_deadline_ns.store(OpenStream::kNoWrite);
    const int sent_before = call_.generated_tokens();
    Apply(call_.WriteDone(ok, cancel_outcome), &pending);
    state_->metrics().AddGeneratedTokens(call_.generated_tokens() - sent_before);
    if (call_.ready_for_chunk()) Pump(&pending);
  }
  Perform(this, std::move(pending));
}

void GenerateStream::OnCancel() {
  const std::string cancel_outcome = CancelOutcomeNow();
  Pending pending;
  {
    absl::MutexLock lock(&link_->mu);
    Apply(call_.Cancelled(cancel_outcome), &pending);
  }
  Perform(this, std::move(pending));
}

void GenerateStream::OnDone() {
  std::string outcome;
  int generated;
  Timing timing;
  bool have_timing;
  {
    absl::MutexLock lock(&link_->mu);
    link_->stream = nullptr;  // late engine, writer and watchdog callbacks now do nothing
    outcome = call_.outcome();
    generated = call_.generated_tokens();
    timing = timing_;
    have_timing = have_timing_;
  }
  state_->metrics().RecordRequest(outcome);
  // One structured line per request. Never the prompt text or the API key; the id only once
  // the engine validated it, and quoted when it holds more than [A-Za-z0-9._:/@+-].
  // generated_tokens counts what was written to the client.
  DCF_LOG(Info) << "request id=" << (request_id_.empty() ? "-" : LogValue(request_id_))
                << " outcome=" << outcome << " prompt_tokens=" << prompt_tokens_
                << " generated_tokens=" << generated
                << " queue_ms=" << (have_timing ? Ms(timing.queue_time) : -1)
                << " ttft_ms=" << (have_timing ? Ms(timing.time_to_first_token) : -1)
                << " total_ms=" << Ms(absl::Now() - start_time_);
  handle_ = RequestHandle();  // cancels the engine request if it is somehow still live
  if (registered_) state_->StreamDone(link_);
}

}  // namespace dcf::server
