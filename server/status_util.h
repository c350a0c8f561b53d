// The one place that maps absl::Status (engine and server internals) to grpc::Status.
#pragma once

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace dcf::server {

// Same code, same message. absl and gRPC share the canonical code numbering, but the mapping
// is spelled out so that a future divergence is a compile-visible change here.
grpc::Status ToGrpcStatus(const absl::Status& status);

// Lower-case name of a gRPC code ("invalid_argument"), used as a metrics label and in logs.
const char* GrpcCodeLabel(grpc::StatusCode code);

}  // namespace dcf::server
