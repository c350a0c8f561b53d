// Everything dcformer-server can be configured with, and its command-line flags.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/execution/backend_options.h"
#include "engine/serving/engine.h"

namespace dcf::server {

struct ServerOptions {
  std::string model_dir;              // config.json + weights (+ tokenizer.json)
  std::string host = "127.0.0.1";     // gRPC listen address
  int port = 50051;
  std::string metrics_host;           // empty: same as host
  int metrics_port = 9090;            // 0: no metrics endpoint

  std::string http_host;              // OpenAI-compatible HTTP front; empty: same as host
  int http_port = 0;                  // 0: no HTTP front
  std::string chat_template;          // Jinja file; empty: the model directory's (chat_template.h)

  BackendOptions backend;             // --backend, --dtype
  int threads = 0;                    // compute threads (OpenMP/BLAS); 0 = environment/cores
  EngineOptions engine;
  bool warmup = true;                 // run one tiny request before reporting SERVING

  int max_receive_message_bytes = 1 << 20;
  int64_t grpc_memory_limit_bytes = 512 << 20;  // gRPC's resource quota; 0 = none
  int max_send_message_bytes = 4 << 20;  // gRPC messages, non-streamed OpenAI bodies
  int max_stream_buffer_bytes = 1 << 20;  // output waiting for a client that does not read
  absl::Duration write_stall_timeout = absl::Seconds(30);  // a message not sent by then ends
  absl::Duration first_write_timeout = absl::Seconds(5);   // ...the first message by then (or
                                                           // write_stall_timeout if shorter)
  int max_open_streams = 1024;        // Generate calls open at once; 0 = no limit
  int max_open_streams_per_peer = 256;  // ...from one client address; 0 = no limit
  int max_concurrent_streams = 256;   // per HTTP/2 connection; 0 = gRPC default (unlimited)
  int keepalive_time_ms = 60'000;     // server pings idle connections this often
  int keepalive_timeout_ms = 20'000;  // ...and closes them if the ack takes longer
  int min_client_ping_interval_ms = 10'000;  // clients pinging faster get GOAWAY
  bool keepalive_permit_without_calls = true;
  int max_connection_idle_ms = 0;     // 0 = never
  int max_connection_age_ms = 0;      // 0 = never (set it behind L4 load balancers)

  bool reflection = false;            // serve gRPC server reflection (no API key checked)
  absl::Duration self_check_interval = absl::Seconds(5);  // 0 = no listener self-check

  std::string api_key_file;           // non-empty: TextGeneration needs a Bearer key
  absl::Duration api_key_reload_interval = absl::Seconds(60);
  std::string tls_cert;               // PEM; with tls_key enables TLS
  std::string tls_key;
  std::string tls_client_ca;          // PEM; requires and verifies client certs (mTLS)
  absl::Duration tls_reload_interval = absl::Seconds(60);  // re-read the TLS files this often

  absl::Duration drain_timeout = absl::Seconds(30);
  absl::Duration engine_stall_timeout = absl::Seconds(30);
  absl::Duration health_poll_interval = absl::Milliseconds(200);
};

// How far past --max-receive-message-bytes gRPC's own receive limit is set: a request up to
// that reaches the service, which refuses it RESOURCE_EXHAUSTED and counts and logs it
// (ServingState::CheckRequestSize); gRPC refuses a larger one itself, unseen. What one stream
// can make gRPC hold before the API key is checked (docs/API.md, "Security").
constexpr int kReceiveLimitMargin = 64 << 10;
inline int GrpcReceiveLimit(const ServerOptions& o) {
  return o.max_receive_message_bytes + kReceiveLimitMargin;
}

// Reads the absl flags defined in server_options.cc (after absl::ParseCommandLine) and
// validates them. InvalidArgument naming the flag.
absl::StatusOr<ServerOptions> ServerOptionsFromFlags();
absl::Status ValidateServerOptions(const ServerOptions& options);

}  // namespace dcf::server
