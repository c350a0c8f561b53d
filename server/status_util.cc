#include "server/status_util.h"

#include <algorithm>
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

HttpError ToHttpError(const absl::Status& status) {
  int http = 500;
  switch (status.code()) {
    case absl::StatusCode::kOk: http = 200; break;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition: http = 400; break;
    case absl::StatusCode::kUnauthenticated: http = 401; break;
    case absl::StatusCode::kPermissionDenied: http = 403; break;
    case absl::StatusCode::kNotFound: http = 404; break;
    case absl::StatusCode::kResourceExhausted: http = 429; break;
    case absl::StatusCode::kUnimplemented: http = 501; break;
    case absl::StatusCode::kUnavailable: http = 503; break;
    case absl::StatusCode::kDeadlineExceeded: http = 504; break;
    default: http = 500; break;
  }
  return {http, HttpErrorType(http)};
}

const char* HttpErrorType(int http_status) {
  switch (http_status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable_error";
    default: return http_status >= 500 ? "server_error" : "invalid_request_error";
  }
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

// gRPC does not say why a call ended: a client's cancel and its deadline both reach the server
// as RST_STREAM(CANCEL). The server's copy of the deadline is the client's timeout counted from
// when the server read the request, so it runs late by however long the request took to get
// read: next to nothing on an idle machine, but hundreds of milliseconds when the server's
// threads wait for a CPU (the issue that fixed this saw 7 of 15 deadlines counted as cancels
// with a 50 ms allowance). The allowance therefore scales with the call's time budget: a cancel
// in the last 10% of the budget (at least 250 ms, at most the whole budget) is the deadline. A
// deliberate cancel that close to one's own deadline is rare, and counting it as a deadline is
// the cheaper mistake: it errs toward reporting the server slow, never toward hiding it.
const char* ClientCancelOutcome(absl::Time start, absl::Time deadline, absl::Time now) {
  if (deadline == absl::InfiniteFuture()) return "cancelled";
  const absl::Duration budget = std::max(deadline - start, absl::ZeroDuration());
  const absl::Duration allowance =
      std::min(budget, std::max(absl::Milliseconds(250), budget / 10));
  return now >= deadline - allowance ? "deadline_exceeded" : "cancelled";
}

}  // namespace dcf::server
