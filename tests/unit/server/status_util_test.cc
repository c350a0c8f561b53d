#include "server/status_util.h"

#include "gtest/gtest.h"

namespace dcf::server {
namespace {

TEST(StatusUtilTest, MapsEveryCodeAndKeepsTheMessage) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  const std::pair<absl::Status, grpc::StatusCode> cases[] = {
      {absl::InvalidArgumentError("a"), grpc::StatusCode::INVALID_ARGUMENT},
      {absl::OutOfRangeError("a"), grpc::StatusCode::OUT_OF_RANGE},
      {absl::ResourceExhaustedError("a"), grpc::StatusCode::RESOURCE_EXHAUSTED},
      {absl::UnavailableError("a"), grpc::StatusCode::UNAVAILABLE},
      {absl::UnauthenticatedError("a"), grpc::StatusCode::UNAUTHENTICATED},
      {absl::FailedPreconditionError("a"), grpc::StatusCode::FAILED_PRECONDITION},
      {absl::CancelledError("a"), grpc::StatusCode::CANCELLED},
      {absl::DeadlineExceededError("a"), grpc::StatusCode::DEADLINE_EXCEEDED},
      {absl::InternalError("a"), grpc::StatusCode::INTERNAL},
      {absl::NotFoundError("a"), grpc::StatusCode::NOT_FOUND},
      {absl::PermissionDeniedError("a"), grpc::StatusCode::PERMISSION_DENIED},
      {absl::UnimplementedError("a"), grpc::StatusCode::UNIMPLEMENTED},
      {absl::DataLossError("a"), grpc::StatusCode::DATA_LOSS},
      {absl::AbortedError("a"), grpc::StatusCode::ABORTED},
      {absl::AlreadyExistsError("a"), grpc::StatusCode::ALREADY_EXISTS},
      {absl::UnknownError("a"), grpc::StatusCode::UNKNOWN},
  };
  for (const auto& [in, code] : cases) {
    grpc::Status out = ToGrpcStatus(in);
    EXPECT_EQ(out.error_code(), code) << in;
    EXPECT_EQ(out.error_message(), "a");
  }
  EXPECT_STREQ(GrpcCodeLabel(grpc::StatusCode::RESOURCE_EXHAUSTED), "resource_exhausted");
}

TEST(StatusUtilTest, HttpStatusesAreOpenAis) {
  const std::pair<absl::Status, int> cases[] = {
      {absl::InvalidArgumentError("a"), 400}, {absl::OutOfRangeError("a"), 400},
      {absl::UnauthenticatedError("a"), 401}, {absl::NotFoundError("a"), 404},
      {absl::ResourceExhaustedError("a"), 429}, {absl::UnavailableError("a"), 503},
      {absl::InternalError("a"), 500},         {absl::UnknownError("a"), 500},
  };
  for (const auto& [in, status] : cases) EXPECT_EQ(ToHttpError(in).status, status) << in;
  EXPECT_STREQ(ToHttpError(absl::InvalidArgumentError("a")).type, "invalid_request_error");
  EXPECT_STREQ(ToHttpError(absl::UnauthenticatedError("a")).type, "authentication_error");
  EXPECT_STREQ(ToHttpError(absl::ResourceExhaustedError("a")).type, "rate_limit_error");
  EXPECT_STREQ(ToHttpError(absl::InternalError("a")).type, "server_error");
  EXPECT_STREQ(HttpErrorType(413), "invalid_request_error");
}

TEST(StatusUtilTest, AcceptedRequestFailuresAreInternal) {
  // Whatever code the engine failed with after accepting the request, the client sees
  // INTERNAL with the engine's message: an INVALID_ARGUMENT would blame the client.
  for (const absl::Status& in :
       {absl::InvalidArgumentError("bad utf-8 from the detokenizer"),
        absl::ResourceExhaustedError("bad utf-8 from the detokenizer"),
        absl::OutOfRangeError("bad utf-8 from the detokenizer"),
        absl::InternalError("bad utf-8 from the detokenizer")}) {
    grpc::Status out = AcceptedRequestFailedStatus(in);
    EXPECT_EQ(out.error_code(), grpc::StatusCode::INTERNAL) << in;
    EXPECT_EQ(out.error_message(), "bad utf-8 from the detokenizer");
  }
  // No message (or even an OK status by mistake): still INTERNAL, never OK.
  for (const absl::Status& in : {absl::OkStatus(), absl::UnknownError("")}) {
    grpc::Status out = AcceptedRequestFailedStatus(in);
    EXPECT_EQ(out.error_code(), grpc::StatusCode::INTERNAL) << in;
    EXPECT_EQ(out.error_message(), "engine error");
  }
}

TEST(StatusUtilTest, ClientCancelOutcome) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const absl::Time never = absl::InfiniteFuture();
  EXPECT_STREQ(ClientCancelOutcome(t0, never, t0 + absl::Hours(1)), "cancelled");
  // A 300 ms deadline whose request reached the server 200 ms late (CPU load): the client's
  // cancel arrives 200 ms before the server's copy. The old 50 ms allowance called it a
  // cancel; this is the case of the issue.
  const absl::Time d = t0 + absl::Milliseconds(300);
  EXPECT_STREQ(ClientCancelOutcome(t0, d, d - absl::Milliseconds(200)), "deadline_exceeded");
  EXPECT_STREQ(ClientCancelOutcome(t0, d, d + absl::Milliseconds(5)), "deadline_exceeded");
  // A budget shorter than the allowance: any cancel is the deadline.
  EXPECT_STREQ(ClientCancelOutcome(t0, t0 + absl::Milliseconds(100), t0), "deadline_exceeded");
  // A 60 s budget: the last 6 s count as the deadline, a cancel after 10 s does not.
  const absl::Time m = t0 + absl::Seconds(60);
  EXPECT_STREQ(ClientCancelOutcome(t0, m, t0 + absl::Seconds(10)), "cancelled");
  EXPECT_STREQ(ClientCancelOutcome(t0, m, m - absl::Seconds(5)), "deadline_exceeded");
  EXPECT_STREQ(ClientCancelOutcome(t0, m, m - absl::Seconds(7)), "cancelled");
}

}  // namespace
}  // namespace dcf::server
