// The one place that maps absl::Status (engine and server internals) to grpc::Status.
#pragma once

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/support/status.h"

namespace dcf::server {

// Same code, same message. absl and gRPC share the canonical code numbering, but the mapping
// is spelled out so that a future divergence is a compile-visible change here.
grpc::Status ToGrpcStatus(const absl::Status& status);

// Status of a call whose request the engine had accepted and then failed (final chunk with
// FinishReason::kError): always INTERNAL, keeping the engine's message ("engine error" when
// it has none). The engine's own code would misdirect the blame: the request was validated
// and accepted, so e.g. an InvalidArgument from the detokenizer is the server's fault, not
// the client's. Errors from Engine::Enqueue (before acceptance) go through ToGrpcStatus.
grpc::Status AcceptedRequestFailedStatus(const absl::Status& engine_error);

// How a call that the client ended (RST_STREAM: its cancel or its deadline, which gRPC does
// not tell apart) is counted: "deadline_exceeded" when it ended in the last 10% of its time
// budget (at least 250 ms of it), "cancelled" before. `start` is when the server received the
// call, `deadline` the server's copy of the client's deadline (InfiniteFuture when none), `now`
// when the cancellation was seen. The .cc says why the allowance is that wide.
const char* ClientCancelOutcome(absl::Time start, absl::Time deadline, absl::Time now);

// The HTTP side of the same mapping, for the OpenAI-compatible front: the status OpenAI uses
// for an absl::Status (400 bad input or a prompt over the limits, 401, 403, 404 unknown model,
// 429 queue full, 501, 503 starting or draining, 504, 500 otherwise) and its error "type".
struct HttpError {
  int status;
  const char* type;  // invalid_request_error, authentication_error, ..., server_error
};
HttpError ToHttpError(const absl::Status& status);
// The OpenAI error type of an HTTP status (the HTTP layer's own refusals: 413, 431, ...).
const char* HttpErrorType(int http_status);

// Lower-case name of a gRPC code ("invalid_argument"), used as a metrics label and in logs.
const char* GrpcCodeLabel(grpc::StatusCode code);

}  // namespace dcf::server
