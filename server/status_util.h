// The one place that maps absl::Status (engine and server internals) to grpc::Status.
#pragma once

#include "absl/status/status.h"
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

// Lower-case name of a gRPC code ("invalid_argument"), used as a metrics label and in logs.
const char* GrpcCodeLabel(grpc::StatusCode code);

}  // namespace dcf::server
