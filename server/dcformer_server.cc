#include "server/dcformer_server.h"


#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "engine/backends/backend_factory.h"
#include "engine/common/file_util.h"
#include "engine/common/logging.h"
#include "engine/common/status_macros.h"
#include "engine/tokenizer/tokenizer.h"
#include "grpc/grpc.h"
#include "grpc/support/time.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace dcf::server {
namespace {

// gRPC's certificate provider reads the TLS files itself (and again on every reload), and
// only logs what it cannot use; reading them once here makes a missing or unreadable file a
// startup error that names the flag.
absl::Status CheckPemFile(const std::string& flag, const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("--", flag, ": ", text.status().message()));
  }
  if (!absl::StrContains(*text, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": '", path, "' holds no PEM block"));
  }
  return absl::OkStatus();
}

std::string HostPort(const std::string& host, int port) {
  if (absl::StrContains(host, ':') && !absl::StartsWith(host, "[")) {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

std::string BaseName(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// After the drain deadline: how long the final messages of cancelled streams get to be
// written before every connection is closed (docs/API.md, "Shutdown").
constexpr absl::Duration kShutdownMargin = absl::Seconds(1);

const std::string& ServiceName() {
  static const std::string* name = new std::string(v1::TextGeneration::service_full_name());
  return *name;
}

}  // namespace

DcformerServer::DcformerServer(ServerOptions options) : options_(std::move(options)) {}

DcformerServer::~DcformerServer() { Shutdown(); }

absl::Status DcformerServer::Start() {
  if (!options_.api_key_file.empty()) {
    ASSIGN_OR_RETURN(ApiKeyChecker checker, ApiKeyChecker::FromFile(options_.api_key_file));
    auth_ = std::make_unique<ApiKeyChecker>(std::move(checker));
  }
  state_ = std::make_unique<ServingState>(&options_, auth_.get(), &metrics_);
  service_ = std::make_unique<TextGenerationService>(state_.get());

  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (!options_.tls_cert.empty()) {
    RETURN_IF_ERROR(CheckPemFile("tls-cert", options_.tls_cert));
    RETURN_IF_ERROR(CheckPemFile("tls-key", options_.tls_key));
    const bool mtls = !options_.tls_client_ca.empty();
    if (mtls) RETURN_IF_ERROR(CheckPemFile("tls-client-ca", options_.tls_client_ca));
    // The provider re-reads the files every --tls-reload-interval: rotated certificates (a
    // renewed Kubernetes Secret) serve new connections without a restart.
    auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        options_.tls_key, options_.tls_cert, options_.tls_client_ca,
        static_cast<unsigned int>(absl::ToInt64Seconds(options_.tls_reload_interval)));
    grpc::experimental::TlsServerCredentialsOptions tls(provider);
    tls.watch_identity_key_cert_pairs();
    if (mtls) {
      tls.watch_root_certs();
      tls.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    } else {
      tls.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    }
    credentials = grpc::experimental::TlsServerCredentials(tls);
  } else {
    credentials = grpc::InsecureServerCredentials();
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string address = HostPort(options_.host, options_.port);
  builder.AddListeningPort(address, credentials, &bound_port_);
  builder.RegisterService(service_.get());
  builder.SetMaxReceiveMessageSize(options_.max_receive_message_bytes);
  builder.SetMaxSendMessageSize(options_.max_send_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // a taken port is an error
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, options_.keepalive_time_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options_.keepalive_timeout_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS,
                             options_.keepalive_permit_without_calls ? 1 : 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             options_.min_client_ping_interval_ms);
  if (options_.max_connection_idle_ms > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, options_.max_connection_idle_ms);
  }
  if (options_.max_connection_age_ms > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS, options_.max_connection_age_ms);
  }
  if (options_.max_concurrent_streams > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options_.max_concurrent_streams);
  }
  // Only receives the shutdown notification of Shutdown()'s early gRPC shutdown.
  shutdown_cq_ = builder.AddCompletionQueue(/*is_frequently_polled=*/false);
  grpc_server_ = builder.BuildAndStart();
  if (grpc_server_ == nullptr || bound_port_ == 0) {
    grpc_server_.reset();
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address));
  }
  SetServing(false);
  DCF_LOG(Info) << "listening on " << HostPort(options_.host, bound_port_)
                << (options_.tls_cert.empty() ? " (plaintext)" : " (TLS)")
                << (options_.tls_client_ca.empty() ? "" : " (mTLS)")
                << (auth_ ? " (api key required)" : "");

  if (options_.metrics_port != 0) {
    const std::string metrics_address = HostPort(options_.metrics_host, options_.metrics_port);
    RETURN_IF_ERROR(metrics_.StartExposer(metrics_address));
    DCF_LOG(Info) << "metrics on http://" << metrics_address << "/metrics";
  }
  return absl::OkStatus();
}

absl::Status DcformerServer::LoadModel() {
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(LoadedModel loaded, dcf::LoadModel(options_.model_dir, options_.backend));
  if (backend_decorator_) loaded.backend = backend_decorator_(std::move(loaded.backend));
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      Tokenizer::FromModelDir(options_.model_dir);
  if (tokenizer.ok()) {
    tokenizer_ = std::move(*tokenizer);
  } else if (absl::IsNotFound(tokenizer.status())) {
    DCF_LOG(Info) << "no tokenizer in " << options_.model_dir << ": token-id prompts only";
  } else {
    return tokenizer.status();
  }
  const ModelConfig config = loaded.config;
  ASSIGN_OR_RETURN(engine_, Engine::Create(std::move(loaded.backend), tokenizer_.get(),
                                           options_.engine, &metrics_));
  Engine* engine = engine_.get();
  metrics_.SetStatsSource([engine]() -> std::optional<EngineStats> { return engine->Stats(); });
  if (options_.warmup) RETURN_IF_ERROR(WarmUp());
  metrics_.SetEnabled(true);

  // What the engine resolved (limits, EOS) is reported as it is: nothing is recomputed here.
  ServedModelInfo info;
  info.model_name = BaseName(options_.model_dir);
  const EngineStats stats = engine->Stats();
  info.backend = stats.backend;
  info.kv_cache_bytes = stats.kv_cache_bytes;
  info.block_size = engine->options().block_size;
  info.kv_blocks_total = stats.kv_blocks_total;
  info.limits = engine->limits();
  state_->PublishEngine(engine, engine->limits(), std::move(info));
  SetServing(true);
  // `info` was moved into the serving state: log from `stats`.
  DCF_LOG(Info) << "serving " << options_.model_dir << " (" << config.ArchitectureName() << ", "
                << config.n_layer << " layers, backend " << stats.backend.name << " on "
                << stats.backend.device << ", " << ComputeDTypeName(stats.backend.dtype)
                << ", KV cache " << stats.kv_cache_bytes / (1 << 20) << " MiB in "
                << stats.kv_blocks_total[0] << " global + " << stats.kv_blocks_total[1]
                << " window blocks) after " << absl::ToDoubleSeconds(absl::Now() - start) << " s";
  return absl::OkStatus();
}

absl::Status DcformerServer::WarmUp() {
  GenerationRequest request;
  request.id = "warmup";
  request.prompt_tokens = {0};
  request.sampling.temperature = 0;
  request.stopping.max_new_tokens = 1;
  request.stopping.ignore_eos = true;
  request.output.text = false;
  ASSIGN_OR_RETURN(RequestHandle handle, engine_->Enqueue(std::move(request)));
  GenerationChunk chunk;
  const absl::Time deadline = absl::Now() + absl::Minutes(5);
  while (!chunk.finished) {
    if (!handle.stream().WaitTake(&chunk, deadline - absl::Now())) {
      return absl::DeadlineExceededError("warm-up request did not finish within 5 minutes");
    }
  }
  if (chunk.finish_reason == FinishReason::kError) {
    return absl::InternalError(absl::StrCat("warm-up failed: ", chunk.error.message()));
  }
  return absl::OkStatus();
}

void DcformerServer::SetServing(bool serving) {
  serving_ = serving;
  metrics_.SetServing(serving);
  if (grpc_server_ == nullptr) return;
  grpc::HealthCheckServiceInterface* health = grpc_server_->GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus(serving);  // the overall "" status
  health->SetServingStatus(ServiceName(), serving);
}

void DcformerServer::Watch(absl::Notification* stop) {
  while (!stop->WaitForNotificationWithTimeout(options_.health_poll_interval)) {
    if (engine_ == nullptr) continue;
    const EngineStats stats = engine_->Stats();
    // An idle loop may not report progress; only a loop with work that stops moving (or a
    // dead loop) is unhealthy.
    const bool busy = stats.num_running + stats.num_waiting > 0;
    const bool stalled = busy && absl::Now() - stats.last_progress > options_.engine_stall_timeout;
    const bool healthy = stats.loop_alive && !stalled && stats.healthy;
    if (healthy != serving_) {
      if (healthy) {
        DCF_LOG(Info) << "engine loop recovered: SERVING";
      } else {
        DCF_LOG(Error) << (!stats.healthy     ? "engine backend failed"
                           : stats.loop_alive ? "engine loop stalled"
                                              : "engine loop stopped")
                       << ": NOT_SERVING";
      }
      SetServing(healthy);
    }
  }
}

void DcformerServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  const absl::Time start = absl::Now();
  const absl::Time drain_deadline = start + options_.drain_timeout;
  if (grpc_server_ != nullptr) {
    // From here on gRPC itself refuses new calls: every connection gets a GOAWAY and the
    // listener closes, so clients send their next calls elsewhere (a round_robin channel
    // picks its other addresses, a DNS-resolving one re-resolves). Calls it accepted before
    // are served: they are part of the drain. Returns at once; shutdown_cq_ gets the event
    // when every call and connection is gone.
    grpc_server_shutdown_and_notify(grpc_server_->c_server(), shutdown_cq_->cq(), nullptr);
  }
  // After the GOAWAY, so that a client watching health on a connection reads the GOAWAY
  // before NOT_SERVING and has stopped using that connection when it learns of the drain.
  SetServing(false);
  if (engine_ != nullptr) {
    DCF_LOG(Info) << "draining " << state_->active_streams() << " stream(s), up to "
                  << absl::FormatDuration(options_.drain_timeout);
    if (!state_->AwaitNoStreams(drain_deadline)) {
      DCF_LOG(Warning) << "drain timeout: cancelling " << state_->active_streams() << " stream(s)";
      state_->StartDraining();
      // Cancels whatever still runs; its streams get a final CANCELLED message, which the
      // margin leaves time to write.
      engine_->Shutdown();
      state_->AwaitNoStreams(absl::Now() + kShutdownMargin);
    }
  }
  if (state_ != nullptr) state_->StartDraining();
  if (engine_ != nullptr) engine_->Shutdown();
  if (grpc_server_ != nullptr) {
    // gRPC's shutdown also waits for every connection to close, and an idle client may not
    // act on the GOAWAY for seconds: close them now (and cancel any call still open).
    // The deadline only matters if a call resists the cancel: it keeps the bound.
    grpc_server_cancel_all_calls(grpc_server_->c_server());
    grpc_server_->Shutdown(absl::ToChronoTime(drain_deadline + kShutdownMargin));
    grpc_server_->Wait();
    grpc_server_.reset();
    // Drained with the core call: its one event carries a null tag, which the C++ Next()
    // cannot take.
    shutdown_cq_->Shutdown();
    grpc_event event;
    do {
      event = grpc_completion_queue_next(shutdown_cq_->cq(), gpr_inf_future(GPR_CLOCK_REALTIME),
                                         nullptr);
    } while (event.type != GRPC_QUEUE_SHUTDOWN);
  }
  service_.reset();
  metrics_.SetStatsSource(nullptr);  // scrapes must not reach the engine once it is gone
  engine_.reset();
  DCF_LOG(Info) << "shut down after " << absl::ToDoubleSeconds(absl::Now() - start) << " s";
}

}  // namespace dcf::server
