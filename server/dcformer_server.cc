#include "server/dcformer_server.h"

#include <sys/resource.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "engine/backends/backend_factory.h"
#include "engine/common/file_util.h"
#include "engine/common/logging.h"
#include "engine/common/status_macros.h"
#include "engine/tokenizer/tokenizer.h"
#include "grpc/grpc.h"
#include "grpc/support/time.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/impl/server_builder_option.h"
#include "grpcpp/impl/server_builder_plugin.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "proto/rpc/grpc_log.h"
#include "server/listener_check.h"

namespace dcf::server {
namespace {

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

// Health Watch streams: at most this many open, this many from one client address
// (health_service.h: when full, the oldest of the heaviest address makes room). One costs
// ~17 KiB. Behind a proxy every client's streams come from the proxy's address.
constexpr int kMaxHealthWatchers = 4096;
constexpr int kMaxHealthWatchersPerPeer = 1024;
// Threads of gRPC's synchronous server (only the reflection service, with --reflection, runs
// there: one thread per open stream, which is why it is capped). The callback services use
// none of these.
constexpr int kMaxSyncServerThreads = 16;
// A self-check whose connection is not accepted within this (or the interval, if shorter) has
// failed; this many failures in a row end the process.
constexpr absl::Duration kSelfCheckTimeout = absl::Seconds(5);
constexpr int kSelfCheckFailuresToExit = 3;
// The metrics listener's bounds beyond HttpServerOptions' defaults (docs/API.md, "Security").
constexpr int kMetricsConnectionsPerIp = 64;
constexpr double kMetricsRequestsPerSecond = 10;
// The OpenAI listener: its threads (a fixed pool holds every stream), connections beyond the
// open-stream cap (idle keep-alive ones and clients sending their request), and the idle
// timeout of a keep-alive connection.
constexpr int kOpenAiThreads = 2;
constexpr int kOpenAiSpareConnections = 256;
constexpr absl::Duration kOpenAiIdleTimeout = absl::Seconds(30);
// The HTTP listeners' connection caps within the open-file limit: past its cap a listener
// closes connections to make room, but until they are closed it may hold twice its cap, and
// gRPC 1.51's listener dies on the first accept() that finds no descriptor (docs/API.md,
// "Security"). So the OpenAI port keeps at most a quarter of the descriptors beyond
// kReservedFiles (half while evicting), the metrics port a sixteenth (an eighth); the rest
// stays for gRPC's connections, the model's files and the process.
constexpr int kReservedFiles = 128;
constexpr int kOpenAiFileShare = 4;
constexpr int kMetricsFileShare = 16;

// Drops gRPC's reflection plugin from a builder: linking grpc++_reflection registers it for
// every server (a static initializer), so leaving it out takes this.
class WithoutReflection : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [](const std::unique_ptr<grpc::ServerBuilderPlugin>& p) {
                                    return p->name() == "proto_server_reflection";
                                  }),
                   plugins->end());
  }
};

// The soft open-file limit (after RaiseOpenFileLimit); INT_MAX when unknown or unlimited.
int OpenFileLimit() {
  rlimit limit = {};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY ||
      limit.rlim_cur > static_cast<rlim_t>(std::numeric_limits<int>::max())) {
    return std::numeric_limits<int>::max();
  }
  return static_cast<int>(limit.rlim_cur);
}

// `wanted` connections for a listener, at most 1/share of the descriptors beyond
// kReservedFiles (and at least 4); logs the cap when the limit binds.
int ConnectionCap(const char* listener, int wanted, int share) {
  const int files = OpenFileLimit();
  const int cap = std::max(4, (files - std::min(files, kReservedFiles)) / share);
  if (cap >= wanted) return wanted;
  DCF_LOG(Warning) << listener << ": at most " << cap << " connections (not " << wanted
                   << ") within the open-file limit of " << files
                   << " (docs/API.md, \"Security\"); past that the oldest idle one is closed";
  return cap;
}

// The soft open-file limit raised to the hard one: a listener of gRPC 1.51 that once fails
// accept() for lack of descriptors never accepts again (docs/API.md, "Security").
void RaiseOpenFileLimit() {
  rlimit limit = {};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  const rlim_t before = limit.rlim_cur;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) limit.rlim_cur = before;
  }
  if (limit.rlim_cur != before) {
    DCF_LOG(Info) << "open-file limit raised from " << before << " to " << limit.rlim_cur;
  }
  if (limit.rlim_cur < 4096) {
    DCF_LOG(Warning) << "open-file limit is " << limit.rlim_cur
                     << " (the hard limit): past about that many connections the gRPC listener "
                        "stops accepting, and the self-check then ends the process";
  }
}

}  // namespace

DcformerServer::DcformerServer(ServerOptions options) : options_(std::move(options)) {}

DcformerServer::~DcformerServer() { Shutdown(); }

absl::Status DcformerServer::Start() {
  if (!options_.api_key_file.empty()) {
    ASSIGN_OR_RETURN(auth_, ApiKeyChecker::FromFile(options_.api_key_file));
  }
  RaiseOpenFileLimit();
  state_ = std::make_unique<ServingState>(&options_, auth_.get(), &metrics_);
  service_ = std::make_unique<TextGenerationService>(state_.get());
  health_ = std::make_unique<HealthService>(std::vector<std::string>{ServiceName()},
                                            kMaxHealthWatchers, kMaxHealthWatchersPerPeer);

  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (!options_.tls_cert.empty()) {
    // gRPC reads validated copies, never the files themselves (tls_files.h): a key that is
    // not the certificate's is a startup error here, and a bad file on a reload keeps the
    // last good pair.
    ASSIGN_OR_RETURN(tls_, TlsFiles::Create({options_.tls_key, options_.tls_cert,
                                             options_.tls_client_ca}));
    LogCertificate("TLS certificate");
    const bool mtls = !options_.tls_client_ca.empty();
    // The provider re-reads the copies every --tls-reload-interval: rotated certificates (a
    // renewed Kubernetes Secret) serve new connections without a restart.
    auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        tls_->identity_path(), tls_->identity_path(), tls_->client_ca_path(),
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

  if (options_.reflection) grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (!options_.reflection) builder.SetOption(std::make_unique<WithoutReflection>());
  const std::string address = HostPort(options_.host, options_.port);
  builder.AddListeningPort(address, credentials, &bound_port_);
  builder.RegisterService(service_.get());
  builder.RegisterService(health_.get());
  // The flag plus a small margin: a message up to that reaches the service, which answers
  // RESOURCE_EXHAUSTED and counts it (ServingState::CheckRequestSize); gRPC refuses larger
  // ones itself, before any service sees them (but only once they are in: what bounds the
  // memory of messages still arriving is the resource quota below).
  builder.SetMaxReceiveMessageSize(GrpcReceiveLimit(options_));
  builder.SetMaxSendMessageSize(options_.max_send_message_bytes);
  // No compressed requests: gRPC 1.51 inflates a message completely before it checks its
  // size (a 1 MB gzip bomb became 1 GB before any limit or API key was looked at). With only
  // identity enabled a compressed message is refused (UNIMPLEMENTED) unread.
  builder.SetCompressionAlgorithmSupportStatus(GRPC_COMPRESS_DEFLATE, false);
  builder.SetCompressionAlgorithmSupportStatus(GRPC_COMPRESS_GZIP, false);
  grpc::ResourceQuota quota("dcformer-server");
  quota.SetMaxThreads(kMaxSyncServerThreads);
  // gRPC 1.51 buffers a request message in full before it checks its size (at the message's
  // end) or any service sees it (so before the API key is checked), and grants a stream the
  // flow-control window for whatever length the message declares: without this bound one
  // unauthenticated client made it hold 8 GiB (docs/API.md, "Security"). Past it gRPC cancels
  // streams ("Buffers full") until its memory is back under the limit.
  if (options_.grpc_memory_limit_bytes > 0) {
    quota.Resize(static_cast<size_t>(options_.grpc_memory_limit_bytes));
  }
  builder.SetResourceQuota(quota);
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
  // gRPC logs a failed bind as a multi-line internal status: collect its lines, and report one
  // clean line with the reason they carry instead.
  rpc::GrpcLogCapture capture;
  grpc_server_ = builder.BuildAndStart();
  const std::vector<rpc::GrpcLogLine> grpc_log = capture.Stop();
  if (grpc_server_ == nullptr || bound_port_ == 0) {
    grpc_server_.reset();
    const std::string reason = rpc::GrpcLogCapture::BindError(grpc_log);
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", address, reason.empty() ? "" : ": ", reason,
        reason == "Address already in use" ? " (another process has this port: stop it or "
                                             "choose another --port)"
                                           : ""));
  }
  for (const rpc::GrpcLogLine& line : grpc_log) rpc::WriteGrpcLogLine(line);
  SetServing(false);
  DCF_LOG(Info) << "listening on " << HostPort(options_.host, bound_port_)
                << (options_.tls_cert.empty() ? " (plaintext)" : " (TLS)")
                << (options_.tls_client_ca.empty() ? "" : " (mTLS)")
                << (auth_ ? " (api key required)" : "")
                << (options_.reflection ? " (reflection)" : "");
  if (options_.reflection && auth_) {
    DCF_LOG(Warning) << "--reflection: server reflection lists the services and their "
                        "messages to anyone, without an api key";
  }
  RETURN_IF_ERROR(StartMetricsEndpoint());
  RETURN_IF_ERROR(StartOpenAiEndpoint());
  if (auth_ || tls_) reload_thread_ = std::thread([this] { ReloadLoop(); });
  return absl::OkStatus();
}

absl::Status DcformerServer::StartMetricsEndpoint() {
  if (options_.metrics_port == 0) return absl::OkStatus();
  HttpRouter router;
  ServerMetrics* metrics = &metrics_;
  router.Add("GET", "/metrics", [metrics](const HttpRequest&) {
    HttpResponse response;
    response.content_type = "text/plain; version=0.0.4; charset=utf-8";
    response.body = metrics->ScrapeText();
    return response;
  });
  HttpServerOptions http;
  http.host = options_.metrics_host;
  http.port = options_.metrics_port;
  // A scraper needs one connection and a request every few seconds: one address gets at
  // most kMetricsConnectionsPerIp, a connection kMetricsRequestsPerSecond.
  http.max_connections = ConnectionCap("metrics", http.max_connections, kMetricsFileShare);
  http.max_connections_per_ip = std::min(kMetricsConnectionsPerIp, http.max_connections);
  http.max_requests_per_second = kMetricsRequestsPerSecond;
  http.on_connection_event = [metrics](absl::string_view event) {
    metrics->RecordHttpConnectionEvent("metrics", event);
  };
  absl::StatusOr<std::unique_ptr<HttpServer>> started =
      HttpServer::Start(std::move(http), std::move(router));
  if (!started.ok()) {
    return absl::UnavailableError(absl::StrCat("metrics: ", started.status().message()));
  }
  metrics_http_ = *std::move(started);
  DCF_LOG(Info) << "metrics on http://" << HostPort(options_.metrics_host, metrics_http_->port())
                << "/metrics";
  return absl::OkStatus();
}

absl::Status DcformerServer::StartOpenAiEndpoint() {
  if (options_.http_port == 0) return absl::OkStatus();
  ChatTemplateContext chat;
  absl::StatusOr<std::string> source = LoadChatTemplateSource(
      options_.model_dir, options_.chat_template, &chat.bos_token, &chat.eos_token);
  if (source.ok()) {
    absl::StatusOr<std::unique_ptr<ChatTemplate>> parsed = ChatTemplate::Parse(*source);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the chat template of ", options_.model_dir, " cannot be used: ",
                       parsed.status().message(), " (docs/OPENAI_API.md lists what is supported; "
                       "--chat-template names another)"));
    }
    chat_template_ = *std::move(parsed);
    chat.chat_template = chat_template_.get();
  } else if (absl::IsNotFound(source.status()) && options_.chat_template.empty()) {
    DCF_LOG(Info) << source.status().message()
                  << ": /v1/chat/completions is refused (400), /v1/completions is served";
  } else {
    return source.status();
  }
  openai_ = std::make_unique<OpenAiService>(state_.get(), std::move(chat),
                                            [this] { return serving_now_.load(); });
  HttpRouter router;
  openai_->AddRoutes(&router);
  HttpServerOptions http;
  http.host = options_.http_host;
  http.port = options_.http_port;
  http.threads = kOpenAiThreads;
  http.max_connections = ConnectionCap("http", options_.max_open_streams > 0
                                                    ? options_.max_open_streams +
                                                          kOpenAiSpareConnections
                                                    : 4096,
                                       kOpenAiFileShare);
  http.max_body_bytes = static_cast<size_t>(options_.max_receive_message_bytes);
  http.idle_timeout = kOpenAiIdleTimeout;
  http.write_timeout = options_.write_stall_timeout;
  http.stream_write_timeout = options_.write_stall_timeout;
  if (tls_) {
    http.tls_identity_file = tls_->identity_path();
    http.tls_client_ca_file = tls_->client_ca_path();
  }
  OpenAiService* service = openai_.get();
  http.admit = [service](const HttpRequest& head) { return service->Admit(head); };
  http.draining_response = [service](const HttpRequest& head) {
    return service->DrainingResponse(head);
  };
  http.error_response = [](int status, absl::string_view message) {
    return OpenAiService::ErrorResponse(status, message);
  };
  ServerMetrics* metrics = &metrics_;
  http.on_connection_event = [metrics](absl::string_view event) {
    metrics->RecordHttpConnectionEvent("openai", event);
  };
  absl::StatusOr<std::unique_ptr<HttpServer>> started =
      HttpServer::Start(std::move(http), std::move(router));
  if (!started.ok()) {
    return absl::Status(started.status().code(),
                        absl::StrCat("http: ", started.status().message()));
  }
  openai_http_ = *std::move(started);
  DCF_LOG(Info) << "OpenAI-compatible API on " << (tls_ ? "https://" : "http://")
                << HostPort(options_.http_host, openai_http_->port()) << "/v1"
                << (auth_ ? " (api key required)" : "");
  return absl::OkStatus();
}

void DcformerServer::LogCertificate(const char* what) {
  const CertificateInfo& cert = tls_->certificate();
  const absl::Time now = absl::Now();
  metrics_.SetCertificateExpiry(cert.not_after);
  if (cert.not_after < now) {
    DCF_LOG(Warning) << what << " '" << cert.subject << "' expired at "
                     << absl::FormatTime(cert.not_after) << ": clients will refuse it";
  } else if (cert.not_before > now) {
    DCF_LOG(Warning) << what << " '" << cert.subject << "' is valid only from "
                     << absl::FormatTime(cert.not_before) << ": clients will refuse it";
  } else {
    DCF_LOG(Info) << what << " '" << cert.subject << "' valid until "
                  << absl::FormatTime(cert.not_after);
  }
}

void DcformerServer::ReloadLoop() {
  const absl::Time start = absl::Now();
  absl::Time next_keys = start + options_.api_key_reload_interval;
  absl::Time next_tls = start + options_.tls_reload_interval;
  while (true) {
    absl::Time next = absl::InfiniteFuture();
    if (auth_) next = std::min(next, next_keys);
    if (tls_) next = std::min(next, next_tls);
    if (reload_stop_.WaitForNotificationWithTimeout(next - absl::Now())) return;
    const absl::Time now = absl::Now();
    if (auth_ && now >= next_keys) {
      ReloadApiKeys();
      next_keys = now + options_.api_key_reload_interval;
    }
    if (tls_ && now >= next_tls) {
      ReloadTls();
      next_tls = now + options_.tls_reload_interval;
    }
  }
}

bool DcformerServer::NoteReload(const char* file, const absl::StatusOr<bool>& reloaded,
                                const std::string& in_force, std::string* last_error) {
  if (!reloaded.ok()) {
    metrics_.RecordCredentialReload(file, false);
    const std::string error(reloaded.status().message());
    if (error != *last_error) {
      DCF_LOG(Error) << file << " not reloaded, " << in_force << " kept in force: " << error;
    }
    *last_error = error;
    return false;
  }
  if (!last_error->empty()) DCF_LOG(Info) << file << ": the files are valid again";
  last_error->clear();
  if (*reloaded) metrics_.RecordCredentialReload(file, true);
  return *reloaded;
}

void DcformerServer::ReloadApiKeys() {
  const std::string in_force = absl::StrCat("the last good ", auth_->num_keys(), " key(s)");
  absl::StatusOr<ApiKeyChecker::Reloaded> reloaded = auth_->Reload();
  if (reloaded.ok() && !reloaded->bad_lines.empty()) {
    // The valid keys apply (a revoked key must not outlive the reload), but the file is not
    // what the operator meant: counted and logged as a failed reload, and as a reload too
    // when the keys in force changed.
    metrics_.RecordCredentialReload("api_keys", false);
    if (reloaded->changed) metrics_.RecordCredentialReload("api_keys", true);
    if (reloaded->bad_lines != last_api_key_error_) {
      DCF_LOG(Error) << "api_keys reloaded with errors, " << auth_->num_keys()
                     << " valid key(s) in force: " << reloaded->bad_lines;
    }
    last_api_key_error_ = reloaded->bad_lines;
    if (reloaded->changed) {
      DCF_LOG(Info) << "api keys reloaded: " << auth_->num_keys() << " key(s)";
    }
    return;
  }
  const absl::StatusOr<bool> changed =
      reloaded.ok() ? absl::StatusOr<bool>(reloaded->changed) : reloaded.status();
  if (NoteReload("api_keys", changed, in_force, &last_api_key_error_)) {
    DCF_LOG(Info) << "api keys reloaded: " << auth_->num_keys() << " key(s)";
  }
}

void DcformerServer::ReloadTls() {
  const std::string in_force =
      absl::StrCat("the last good certificate '", tls_->certificate().subject, "'");
  if (NoteReload("tls", tls_->Reload(), in_force, &last_tls_error_)) {
    LogCertificate("TLS certificate reloaded:");
    if (openai_http_ != nullptr) {
      if (absl::Status s = openai_http_->ReloadTls(); !s.ok()) {
        DCF_LOG(Error) << "http: TLS not reloaded, the last good files kept: " << s.message();
      }
    }
  }
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
  info.prefix_caching = stats.prefix_caching;
  info.limits = engine->limits();
  metrics_.SetCacheConfig(info.block_size, info.kv_blocks_total[0]);
  state_->PublishEngine(engine, engine->limits(), std::move(info));
  SetServing(true);
  // `info` was moved into the serving state: log from `stats`.
  DCF_LOG(Info) << "serving " << options_.model_dir << " (" << config.ArchitectureName() << ", "
                << config.n_layer << " layers, backend " << stats.backend.name << " on "
                << stats.backend.device << ", " << WeightsName(stats.backend)
                << ", KV cache " << stats.kv_cache_bytes / (1 << 20) << " MiB in "
                << stats.kv_blocks_total[0] << " global + " << stats.kv_blocks_total[1]
                << " window blocks, prefix caching " << (stats.prefix_caching ? "on" : "off")
                << ") after " << absl::ToDoubleSeconds(absl::Now() - start) << " s";
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
  serving_now_.store(serving);
  metrics_.SetServing(serving);
  if (health_ != nullptr) health_->SetServing(serving);  // "" and the TextGeneration service
}

absl::Status DcformerServer::Watch(absl::Notification* stop) {
  const std::string self_check_host = SelfCheckHost(options_.host);
  const absl::Duration self_check_timeout =
      std::min(kSelfCheckTimeout, options_.self_check_interval);
  absl::Time next_self_check = absl::Now() + options_.self_check_interval;
  int self_check_failures = 0;
  bool self_check_fallback_logged = false;
  while (!stop->WaitForNotificationWithTimeout(options_.health_poll_interval)) {
    if (engine_ == nullptr) continue;
    state_->EndStalledStreams(SteadyNowNanos());
    if (options_.self_check_interval > absl::ZeroDuration() && absl::Now() >= next_self_check) {
      bool queue_visible = true;
      const absl::Status probe =
          ProbeListener(self_check_host, bound_port_, self_check_timeout, &queue_visible);
      next_self_check = absl::Now() + options_.self_check_interval;
      if (!queue_visible && !self_check_fallback_logged) {
        self_check_fallback_logged = true;
        DCF_LOG(Warning) << "self-check: /proc/self/net/tcp{,6} shows no listener on port "
                         << bound_port_ << " (a sandboxed runtime?): checking only that a "
                            "connect completes, which notices a listener that stopped "
                            "accepting only once its accept queue is full";
      }
      if (probe.ok()) {
        if (self_check_failures > 0) DCF_LOG(Info) << "self-check: the gRPC port answers again";
        self_check_failures = 0;
      } else {
        ++self_check_failures;
        metrics_.RecordSelfCheckFailure();
        DCF_LOG(Error) << "self-check " << self_check_failures << "/" << kSelfCheckFailuresToExit
                       << ": a new connection to " << HostPort(self_check_host, bound_port_)
                       << " is not accepted (" << probe.message() << ")";
        if (self_check_failures >= kSelfCheckFailuresToExit) {
          SetServing(false);
          return absl::UnavailableError(
              "the gRPC listener accepts no new connections (gRPC 1.51 stops accepting once "
              "it ran out of file descriptors): exiting so that the process is restarted");
        }
      }
    }
    const EngineStats stats = engine_->Stats();
    // An idle loop may not report progress; only a loop with work that stops moving (or a
    // dead loop) is unhealthy.
    const bool busy = stats.num_running + stats.num_waiting > 0;
    const bool stalled = busy && absl::Now() - stats.last_progress > options_.engine_stall_timeout;
    const bool healthy =
        stats.loop_alive && !stalled && stats.healthy && self_check_failures == 0;
    if (healthy != serving_) {
      if (healthy) {
        DCF_LOG(Info) << "engine loop recovered: SERVING";
      } else {
        DCF_LOG(Error) << (self_check_failures > 0 ? "listener self-check failed"
                           : !stats.healthy        ? "engine backend failed"
                           : stats.loop_alive      ? "engine loop stalled"
                                                   : "engine loop stopped")
                       << ": NOT_SERVING";
      }
      SetServing(healthy);
    }
  }
  return absl::OkStatus();
}

void DcformerServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  const bool started = grpc_server_ != nullptr || engine_ != nullptr;
  reload_stop_.Notify();
  if (reload_thread_.joinable()) reload_thread_.join();
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
  // The HTTP front likewise: new requests get 503 and idle keep-alive connections close; the
  // streams it runs are part of the drain (ServingState counts them with gRPC's).
  if (openai_http_ != nullptr) openai_http_->StartDraining();
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
  // Every HTTP stream got its final event (or was cancelled with the engine), but a slow
  // reader may not have taken all of it yet: the connections write out what they hold (the
  // last events, [DONE], the last chunk) within the drain's bound, then the rest closes.
  if (openai_http_ != nullptr) {
    // After a drain timeout the cancel margin is spent: the writes still get one more.
    if (!openai_http_->AwaitExchanges(std::max(drain_deadline, absl::Now()) + kShutdownMargin)) {
      DCF_LOG(Warning) << "drain timeout: closing HTTP responses not yet written out";
    }
    openai_http_->Stop();
  }
  service_.reset();
  metrics_.SetStatsSource(nullptr);  // scrapes must not reach the engine once it is gone
  engine_.reset();
  // Last, so that the metrics endpoint serves the whole drain, and counted in the line below:
  // the process exits right after it.
  if (metrics_http_ != nullptr) metrics_http_->Stop();
  if (started) {
    DCF_LOG(Info) << "shut down after " << absl::ToDoubleSeconds(absl::Now() - start) << " s";
  }
}

}  // namespace dcf::server
