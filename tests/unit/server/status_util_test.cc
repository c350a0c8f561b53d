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

}  // namespace
}  // namespace dcf::server
