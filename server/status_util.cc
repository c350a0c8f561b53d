#include "server/status_util.h"

#include <string>

namespace dcf::server {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  grpc::StatusCode code = grpc::StatusCode::UNKNOWN;
  switch (status.code()) {
    case absl::StatusCode::kOk: return grpc::Status::OK;
    case absl::StatusCode::kCancelled: code = grpc::StatusCode::CANCELLED; break;
    case absl::StatusCode::kUnknown: code = grpc::StatusCode::UNKNOWN; break;
    case absl::StatusCode::kInvalidArgument: code = grpc::StatusCode::INVALID_ARGUMENT; break;
    case absl::StatusCode::kDeadlineExceeded: code = grpc::StatusCode::DEADLINE_EXCEEDED; break;
    case absl::StatusCode::kNotFound: code = grpc::StatusCode::NOT_FOUND; break;
    case absl::StatusCode::kAlreadyExists: code = grpc::StatusCode::ALREADY_EXISTS; break;
    case absl::StatusCode::kPermissionDenied: code = grpc::StatusCode::PERMISSION_DENIED; break;
    case absl::StatusCode::kResourceExhausted: code = grpc::StatusCode::RESOURCE_EXHAUSTED; break;
    case absl::StatusCode::kFailedPrecondition:
      code = grpc::StatusCode::FAILED_PRECONDITION;
      break;
    case absl::StatusCode::kAborted: code = grpc::StatusCode::ABORTED; break;
    case absl::StatusCode::kOutOfRange: code = grpc::StatusCode::OUT_OF_RANGE; break;
    case absl::StatusCode::kUnimplemented: code = grpc::StatusCode::UNIMPLEMENTED; break;
    case absl::StatusCode::kInternal: code = grpc::StatusCode::INTERNAL; break;
    case absl::StatusCode::kUnavailable: code = grpc::StatusCode::UNAVAILABLE; break;
    case absl::StatusCode::kDataLoss: code = grpc::StatusCode::DATA_LOSS; break;
    case absl::StatusCode::kUnauthenticated: code = grpc::StatusCode::UNAUTHENTICATED; break;
    default: code = grpc::StatusCode::UNKNOWN; break;
  }
  return grpc::Status(code, std::string(status.message()));
}

grpc::Status AcceptedRequestFailedStatus(const absl::Status& engine_error) {
  std::string message(engine_error.message());
  if (message.empty()) message = "engine error";
  return grpc::Status(grpc::StatusCode::INTERNAL, message);
}

const char* GrpcCodeLabel(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "ok";
    case grpc::StatusCode::CANCELLED: return "cancelled";
    case grpc::StatusCode::UNKNOWN: return "unknown";
    case grpc::StatusCode::INVALID_ARGUMENT: return "invalid_argument";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "deadline_exceeded";
    case grpc::StatusCode::NOT_FOUND: return "not_found";
    case grpc::StatusCode::ALREADY_EXISTS: return "already_exists";
    case grpc::StatusCode::PERMISSION_DENIED: return "permission_denied";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "resource_exhausted";
    case grpc::StatusCode::FAILED_PRECONDITION: return "failed_precondition";
    case grpc::StatusCode::ABORTED: return "aborted";
    case grpc::StatusCode::OUT_OF_RANGE: return "out_of_range";
    case grpc::StatusCode::UNIMPLEMENTED: return "unimplemented";
    case grpc::StatusCode::INTERNAL: return "internal";
    case grpc::StatusCode::UNAVAILABLE: return "unavailable";
    case grpc::StatusCode::DATA_LOSS: return "data_loss";
    case grpc::StatusCode::UNAUTHENTICATED: return "unauthenticated";
    default: return "unknown";
  }
}

}  // namespace dcf::server
