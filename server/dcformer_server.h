// The dcformer-server process minus main(): gRPC server (TextGeneration, health, optional
// reflection), metrics endpoint, model loading, credential reloads, health watchdog and
// graceful drain.
//
// Usage (main thread only):
//   DcformerServer server(options);
//   RETURN_IF_ERROR(server.Start());         // listening; health NOT_SERVING; calls UNAVAILABLE
//   RETURN_IF_ERROR(server.LoadModel());     // load, warm up; health SERVING
//   absl::Status s = server.Watch(&stop);    // watchdogs until `stop` is notified, or an error
//                                            // when the listener stopped accepting (exit 1)
//   server.Shutdown();                       // drain (--drain-timeout), cancel the rest, stop
//
// Shutdown(): GOAWAY on every connection and the listener closed at once (clients move their
// new calls to other replicas), health NOT_SERVING, then the running streams get up to
// --drain-timeout to finish; what still runs then is cancelled and gets up to 1 s more for
// its final message, after which every connection is closed, idle ones included. Returns
// within --drain-timeout + 1 s.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/grpcpp.h"
#include "server/auth.h"
#include "server/health_service.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_service.h"
#include "server/serving_state.h"
#include "server/server_options.h"
#include "server/text_generation_service.h"
#include "server/tls_files.h"

namespace dcf {
class Tokenizer;
}

namespace dcf::server {

class DcformerServer {
 public:
  explicit DcformerServer(ServerOptions options);
  ~DcformerServer();

  // Wraps the backend LoadModel creates before the engine gets it (e.g. a test build's fault
  // injection, tests/testing/fault_injecting_backend.h). Call before LoadModel.
  using BackendDecorator = dcf::BackendDecorator;
  void SetBackendDecorator(BackendDecorator decorator) { backend_decorator_ = std::move(decorator); }

  absl::Status Start();
  // The gRPC port actually bound (useful with --port 0).
  int port() const { return bound_port_; }
  // The metrics port actually bound (0 when there is none).
  int metrics_port() const { return metrics_http_ ? metrics_http_->port() : 0; }
  // The OpenAI-compatible HTTP port actually bound (0 when there is none).
  int http_port() const { return openai_http_ ? openai_http_->port() : 0; }
  absl::Status LoadModel();
  // Health watchdog (engine progress, listener self-check) and the write-stall watchdog,
  // every --health-poll-interval until `stop` is notified. Unavailable when the listener
  // self-check failed kSelfCheckFailuresToExit times in a row (gRPC stopped accepting): the
  // caller drains and exits non-zero so that the process is restarted.
  absl::Status Watch(absl::Notification* stop);
  void Shutdown();

 private:
  void SetServing(bool serving);
  absl::Status WarmUp();
  absl::Status StartMetricsEndpoint();
  // Loads the chat template and starts the OpenAI-compatible listener (--http-port).
  absl::Status StartOpenAiEndpoint();
  // Re-reads --api-key-file and the TLS files on their intervals until reload_stop_.
  void ReloadLoop();
  void ReloadApiKeys();
  void ReloadTls();
  // Logs and counts one reload of `file` ("api_keys", "tls"); an error is logged once until
  // it changes. True when the reload changed what is in force.
  bool NoteReload(const char* file, const absl::StatusOr<bool>& reloaded,
                  const std::string& in_force, std::string* last_error);
  void LogCertificate(const char* what);

  const ServerOptions options_;
  BackendDecorator backend_decorator_;
  std::unique_ptr<ApiKeyChecker> auth_;
  std::unique_ptr<TlsFiles> tls_;
  ServerMetrics metrics_;
  std::unique_ptr<HttpServer> metrics_http_;
  std::unique_ptr<ChatTemplate> chat_template_;
  std::unique_ptr<OpenAiService> openai_;
  std::unique_ptr<HttpServer> openai_http_;
  std::atomic<bool> serving_now_{false};  // what health says, for the HTTP /health
  std::unique_ptr<ServingState> state_;
  std::unique_ptr<TextGenerationService> service_;
  std::unique_ptr<HealthService> health_;  // outlives grpc_server_
  std::unique_ptr<grpc::ServerCompletionQueue> shutdown_cq_;  // outlives grpc_server_
  std::unique_ptr<grpc::Server> grpc_server_;
  int bound_port_ = 0;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Engine> engine_;  // destroyed after the gRPC server
  bool serving_ = false;
  bool shut_down_ = false;
  absl::Notification reload_stop_;
  std::thread reload_thread_;
  std::string last_api_key_error_, last_tls_error_;  // see NoteReload
};

}  // namespace dcf::server
