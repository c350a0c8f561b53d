#include "client/wait_ready.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace dcf::client {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

absl::Status WaitUntilServing(const ClientChannel& channel, const std::string& target,
                              const std::string& service, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::unique_ptr<Health::Stub> stub = Health::NewStub(channel.channel());
  HealthCheckRequest request;
  request.set_service(service);
  std::string last_status;  // empty until the server answered once
  while (true) {
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    context.set_deadline(absl::ToChronoTime(deadline));
    std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> reader =
        stub->Watch(&context, request);
    HealthCheckResponse response;
    bool serving = false;
    while (!serving && reader->Read(&response)) {
      last_status = HealthCheckResponse::ServingStatus_Name(response.status());
      serving = response.status() == HealthCheckResponse::SERVING;
    }
    if (serving) context.TryCancel();
    const grpc::Status status = reader->Finish();
    if (serving) return absl::OkStatus();
    if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED || absl::Now() >= deadline) {
      break;
    }
    // The watch ended early: the connection went away (a server restarting or draining).
    // Watch again, after a pause that keeps a server that ends every call from being spun on.
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE &&
        status.error_code() != grpc::StatusCode::CANCELLED && !status.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          absl::StrCat("health Watch on ", target, ": ", status.error_message()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::string seen;
  if (!last_status.empty()) {
    seen = absl::StrCat("last status ", last_status);
  } else {
    // Never answered: one fail-fast call tells why (gRPC's connection error).
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    HealthCheckResponse response;
    const grpc::Status status = stub->Check(&context, request, &response);
    seen = status.ok() ? absl::StrCat("last status ",
                                      HealthCheckResponse::ServingStatus_Name(response.status()))
                       : absl::StrCat("no connection: ", DescribeRpcError(status, channel.tls()));
  }
  return absl::DeadlineExceededError(absl::StrCat("the server at ", target,
                                                  " was not SERVING within ",
                                                  absl::FormatDuration(timeout), " (", seen, ")"));
}

}  // namespace dcf::client
