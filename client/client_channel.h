// Channel and call setup shared by the project's clients (dcformer-cli, dcformer-loadgen):
// target, TLS / mTLS credentials, API key metadata, deadlines, status code names.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace dcf::client {

struct ChannelOptions {
  std::string target = "127.0.0.1:50051";
  bool tls = false;                 // implied by any of the TLS files below
  std::string tls_ca;               // PEM roots to verify the server (default: system roots)
  std::string tls_cert;             // PEM client certificate (mTLS)
  std::string tls_key;              // PEM client key (mTLS)
  std::string tls_server_name;      // override the name checked in the server certificate
  std::string api_key_file;         // first non-comment line is sent as a Bearer token
  absl::Duration timeout = absl::ZeroDuration();  // per call; zero = none
  int max_receive_message_bytes = 64 << 20;
  // Longest pause between connection attempts; zero = gRPC's (up to 120 s). A client that
  // waits for a server to come up uses about a second, so it connects soon after it listens.
  absl::Duration max_reconnect_backoff = absl::ZeroDuration();
};

class ClientChannel {
 public:
  // Reads the TLS and key files; NotFound / InvalidArgument naming the flag.
  static absl::StatusOr<ClientChannel> Create(const ChannelOptions& options);

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  // Applies the API key and the timeout to a new call's context.
  void Prepare(grpc::ClientContext* context) const;
  // Whether the channel uses TLS.
  bool tls() const { return tls_; }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::string api_key_;
  absl::Duration timeout_;
  bool tls_ = false;
};

// The canonical name of a gRPC status code ("UNAUTHENTICATED"), or "CODE_<n>" for a value
// outside the 17 defined codes.
std::string StatusCodeName(grpc::StatusCode code);

// "CODE: message" of a failed call, with a hint when a plaintext call was probably refused by
// a TLS server (gRPC reports only "Socket closed"), a TLS one by a plaintext server, or the
// server's certificate was not trusted; and, when gRPC logged an error the status does not
// carry (a TLS file it could not use: "UNAVAILABLE: empty address list" says nothing), the
// first such error: "(gRPC: Could not load any root certificate.)".
std::string DescribeRpcError(const grpc::Status& status, bool tls);

// For command-line clients, which report every failure through the call's status: gRPC's own
// log lines go to the sink (proto/rpc/grpc_log.h) unprinted, unless GRPC_VERBOSITY or GRPC_TRACE asks
// for them; DescribeRpcError adds the first error among them.
void InstallClientGrpcLogging();

}  // namespace dcf::client
