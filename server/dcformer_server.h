// The dcformer-server process minus main(): gRPC server (TextGeneration, health,
// reflection), metrics endpoint, model loading, health watchdog and graceful drain.
//
// Usage (main thread only):
//   DcformerServer server(options);
//   RETURN_IF_ERROR(server.Start());         // listening; health NOT_SERVING; calls UNAVAILABLE
//   RETURN_IF_ERROR(server.LoadModel());     // load, warm up; health SERVING
//   server.Watch(&stop);                     // health watchdog until `stop` is notified
//   server.Shutdown();                       // drain (--drain-timeout), cancel the rest, stop
//
// Shutdown(): GOAWAY on every connection and the listener closed at once (clients move their
// new calls to other replicas), health NOT_SERVING, then the running streams get up to
// --drain-timeout to finish; what still runs then is cancelled and gets up to 1 s more for
// its final message, after which every connection is closed, idle ones included. Returns
// within --drain-timeout + 1 s (the process exits about 1 s later: the metrics endpoint stops).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/grpcpp.h"
#include "server/auth.h"
#include "server/metrics.h"
#include "server/serving_state.h"
#include "server/server_options.h"
#include "server/text_generation_service.h"

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
  absl::Status LoadModel();
  void Watch(absl::Notification* stop);
  void Shutdown();

 private:
  void SetServing(bool serving);
  absl::Status WarmUp();

  const ServerOptions options_;
  BackendDecorator backend_decorator_;
  std::unique_ptr<ApiKeyChecker> auth_;
  ServerMetrics metrics_;
  std::unique_ptr<ServingState> state_;
  std::unique_ptr<TextGenerationService> service_;
  std::unique_ptr<grpc::ServerCompletionQueue> shutdown_cq_;  // outlives grpc_server_
  std::unique_ptr<grpc::Server> grpc_server_;
  int bound_port_ = 0;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Engine> engine_;  // destroyed after the gRPC server
  bool serving_ = false;
  bool shut_down_ = false;
};

}  // namespace dcf::server
