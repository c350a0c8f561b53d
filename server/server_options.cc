#include "server/server_options.h"

#include <cstdint>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "engine/backends/backend_flags.h"

#ifndef DCF_DEFAULT_MODEL_DIR
#define DCF_DEFAULT_MODEL_DIR "models/dcformer-kjv"
#endif

ABSL_FLAG(std::string, model, DCF_DEFAULT_MODEL_DIR,
          "model directory: config.json, weights and (optionally) tokenizer.json");
ABSL_FLAG(std::string, host, "127.0.0.1", "gRPC listen address (0.0.0.0 / [::] for all)");
ABSL_FLAG(int, port, 50051, "gRPC listen port");
ABSL_FLAG(std::string, metrics_host, "", "Prometheus /metrics listen address (default: --host)");
ABSL_FLAG(int, metrics_port, 9090, "Prometheus /metrics port; 0 disables the endpoint");
ABSL_FLAG(std::string, http_host, "", "OpenAI-compatible HTTP listen address (default: --host)");
ABSL_FLAG(int, http_port, 0,
          "OpenAI-compatible HTTP port (/v1/completions, /v1/chat/completions, /v1/models, "
          "/health); 0 disables it");
ABSL_FLAG(std::string, chat_template, "",
          "Jinja chat template for /v1/chat/completions (default: the model directory's "
          "chat_template.jinja or tokenizer_config.json's). A file that is not a regular file, "
          "is over 1 MiB or does not parse (outside the supported Jinja subset) is a startup "
          "error; one that parses but fails on some messages fails those requests with 400");
ABSL_FLAG(int64_t, kv_cache_bytes, 0,
          "KV-cache memory budget in bytes; 0 = --kv-cache-fraction of memory");
ABSL_FLAG(double, kv_cache_fraction, 0.25,
          "KV-cache budget as a fraction of the memory left after weights and workspace: free "
          "device memory (cuda), or host memory within the container's limit (cpu)");
ABSL_FLAG(int, block_size, 16, "tokens per KV-cache block");
ABSL_FLAG(bool, prefix_caching, true,
          "reuse the KV cache of prompt prefixes earlier requests computed (automatic prefix "
          "caching; requests share only with the same cache_salt); --noprefix-caching: off");
ABSL_FLAG(int, spec_tokens, 0,
          "speculative decoding by prompt lookup: tokens drafted per decoding sequence and step "
          "(the output is identical to plain decoding's); 0 = off");
ABSL_FLAG(int, spec_ngram_min, 2, "speculative decoding: shortest suffix matched in the context");
ABSL_FLAG(int, spec_ngram_max, 4, "speculative decoding: longest suffix matched in the context");
ABSL_FLAG(int, spec_max_step_drafts, 0,
          "speculative decoding: drafted tokens verified per step, all sequences; 0 = 4 x "
          "--spec-tokens");
ABSL_FLAG(int, spec_step_tokens, 0,
          "speculative decoding: drafts fill a step only up to this many tokens (decodes and "
          "prefill chunks included); 0 = measured at startup, the largest step the backend "
          "still runs at the cost of reading its weights (cpu; no cap on cuda); 1, given or "
          "measured, turns speculation off");
ABSL_FLAG(std::string, pipeline_steps, "auto",
          "pipelined steps: the next engine step is planned and launched before the previous "
          "one's results are waited for, hiding the host's work between steps (the output is "
          "that of off, up to batch composition): auto (on for cuda, off for cpu, where it "
          "would only delay each token by a step), on or off");
ABSL_FLAG(int, threads, 0,
          "compute threads of the engine (OpenMP and BLAS); 0 = OMP_NUM_THREADS or every core. "
          "Idle compute threads sleep instead of spinning unless OMP_WAIT_POLICY says otherwise");
ABSL_FLAG(int, max_num_seqs, 64, "most sequences running in one engine step");
ABSL_FLAG(int, max_batch_tokens, 512, "token budget of one engine step (decode + prefill)");
ABSL_FLAG(int, max_queued_requests, 256,
          "waiting requests beyond this are rejected with RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_queued_prompt_tokens, 1 << 20,
          "total prompt tokens waiting beyond this are rejected with RESOURCE_EXHAUSTED");
ABSL_FLAG(int, max_prompt_tokens, 0, "longest accepted prompt; 0 = model context");
ABSL_FLAG(int, max_new_tokens, 0, "largest accepted max_new_tokens; 0 = model context");
ABSL_FLAG(int, default_max_new_tokens, 256, "max_new_tokens of requests that leave it unset");
ABSL_FLAG(bool, warmup, true, "run one tiny request before reporting SERVING");
ABSL_FLAG(int, max_receive_message_bytes, 1 << 20, "largest accepted request message");
ABSL_FLAG(int, max_send_message_bytes, 4 << 20,
          "largest response message (gRPC), and largest non-streamed OpenAI response body: "
          "past it the request is cancelled and gets 400 (stream it instead)");
ABSL_FLAG(int64_t, grpc_memory_limit_bytes, int64_t{512} << 20,
          "memory gRPC may hold for connections and calls (its resource quota): past it, it "
          "cancels streams until it is back under; what bounds request messages that are still "
          "arriving (gRPC holds each in full before any check, API key included); 0 = no limit");
ABSL_FLAG(int, max_stream_buffer_bytes, 1 << 20,
          "a Generate stream whose unsent output grows past this (the client stopped reading) "
          "is cancelled with RESOURCE_EXHAUSTED; at most half of --max-send-message-bytes");
ABSL_FLAG(absl::Duration, write_stall_timeout, absl::Seconds(30),
          "a Generate stream whose message (at most 16 KiB) is not sent within this (the client "
          "reads less than 16 KiB per this time, or nothing) ends with RESOURCE_EXHAUSTED");
ABSL_FLAG(absl::Duration, first_write_timeout, absl::Seconds(5),
          "a Generate stream whose first message is not sent within this (the client never "
          "opened its flow-control window) ends with RESOURCE_EXHAUSTED; --write-stall-timeout "
          "when that is shorter");
ABSL_FLAG(int, max_open_streams, 1024,
          "Generate calls open at once (queued, running or still writing); beyond, new ones get "
          "RESOURCE_EXHAUSTED; 0 = no limit");
ABSL_FLAG(int, max_open_streams_per_peer, 256,
          "Generate calls open at once from one client address (IP, any port); beyond, its new "
          "ones get RESOURCE_EXHAUSTED. Behind a proxy every call comes from the proxy's "
          "address: raise it or set 0 (no limit) there");
ABSL_FLAG(int, max_concurrent_streams, 256,
          "concurrent calls per HTTP/2 connection (SETTINGS_MAX_CONCURRENT_STREAMS); 0 = gRPC's "
          "default, unlimited");
ABSL_FLAG(bool, reflection, false,
          "serve gRPC server reflection (grpcurl without the .proto); it checks no API key");
ABSL_FLAG(absl::Duration, self_check_interval, absl::Seconds(5),
          "how often the server checks that its gRPC listener accepts a new connection: when "
          "not, it reports NOT_SERVING, and after three failures in a row drains and exits 1; "
          "0 = off");
ABSL_FLAG(int, keepalive_time_ms, 60000, "server keepalive ping interval (ms)");
ABSL_FLAG(int, keepalive_timeout_ms, 20000, "close the connection if a ping ack takes longer");
ABSL_FLAG(int, min_client_ping_interval_ms, 10000,
          "clients that ping more often than this (without data) get GOAWAY");
ABSL_FLAG(bool, keepalive_permit_without_calls, true, "allow client pings with no active call");
ABSL_FLAG(int, max_connection_idle_ms, 0, "close idle connections after this (0 = never)");
ABSL_FLAG(int, max_connection_age_ms, 0, "close connections after this age (0 = never)");
ABSL_FLAG(std::string, api_key_file, "",
          "file of API keys, one per line; TextGeneration calls then need "
          "'authorization: Bearer <key>' (health stays open)");
ABSL_FLAG(absl::Duration, api_key_reload_interval, absl::Seconds(60),
          "how often --api-key-file is re-read: edit it and the new keys apply to new calls, "
          "without a restart (a file that cannot be read or holds no key keeps the last keys)");
ABSL_FLAG(std::string, tls_cert, "", "PEM server certificate chain (with --tls-key: TLS)");
ABSL_FLAG(std::string, tls_key, "", "PEM server private key");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: require and verify client certificates (mTLS)");
ABSL_FLAG(absl::Duration, tls_reload_interval, absl::Seconds(60),
          "how often the TLS key, certificate and client CA files are re-read: replace them "
          "and new connections use the new ones, without a restart");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(30),
          "on SIGTERM, SIGINT or SIGHUP, let running streams finish this long, then cancel them");
ABSL_FLAG(absl::Duration, engine_stall_timeout, absl::Seconds(30),
          "report NOT_SERVING when the engine loop made no progress for this long");

namespace dcf::server {

absl::StatusOr<ServerOptions> ServerOptionsFromFlags() {
  ServerOptions o;
  o.model_dir = absl::GetFlag(FLAGS_model);
  o.host = absl::GetFlag(FLAGS_host);
  o.port = absl::GetFlag(FLAGS_port);
  o.metrics_host = absl::GetFlag(FLAGS_metrics_host);
  if (o.metrics_host.empty()) o.metrics_host = o.host;
  o.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  o.http_host = absl::GetFlag(FLAGS_http_host);
  if (o.http_host.empty()) o.http_host = o.host;
  o.http_port = absl::GetFlag(FLAGS_http_port);
  o.chat_template = absl::GetFlag(FLAGS_chat_template);
  if (absl::GetFlag(FLAGS_kv_cache_bytes) < 0) {
    return absl::InvalidArgumentError("--kv-cache-bytes must be >= 0");
  }
  absl::StatusOr<BackendOptions> backend = BackendOptionsFromFlags();
  if (!backend.ok()) return backend.status();
  o.backend = *backend;
  o.engine.kv_cache_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_kv_cache_bytes));
  o.engine.kv_cache_fraction = absl::GetFlag(FLAGS_kv_cache_fraction);
  o.engine.block_size = absl::GetFlag(FLAGS_block_size);
  o.engine.prefix_caching = absl::GetFlag(FLAGS_prefix_caching);
  o.engine.spec_tokens = absl::GetFlag(FLAGS_spec_tokens);
  o.engine.spec_ngram_min = absl::GetFlag(FLAGS_spec_ngram_min);
  o.engine.spec_ngram_max = absl::GetFlag(FLAGS_spec_ngram_max);
  o.engine.spec_max_step_drafts = absl::GetFlag(FLAGS_spec_max_step_drafts);
  o.engine.spec_step_tokens = absl::GetFlag(FLAGS_spec_step_tokens);
  absl::StatusOr<PipelineSteps> pipeline = ParsePipelineSteps(absl::GetFlag(FLAGS_pipeline_steps));
  if (!pipeline.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--pipeline-steps: ", pipeline.status().message()));
  }
  o.engine.pipeline_steps = *pipeline;
  o.threads = absl::GetFlag(FLAGS_threads);
  o.engine.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  o.engine.max_num_batched_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  o.engine.max_queued_requests = absl::GetFlag(FLAGS_max_queued_requests);
  o.engine.max_queued_prompt_tokens = absl::GetFlag(FLAGS_max_queued_prompt_tokens);
  o.engine.max_prompt_tokens = absl::GetFlag(FLAGS_max_prompt_tokens);
  o.engine.max_new_tokens_limit = absl::GetFlag(FLAGS_max_new_tokens);
  o.engine.default_max_new_tokens = absl::GetFlag(FLAGS_default_max_new_tokens);
  o.warmup = absl::GetFlag(FLAGS_warmup);
  o.max_receive_message_bytes = absl::GetFlag(FLAGS_max_receive_message_bytes);
  o.max_send_message_bytes = absl::GetFlag(FLAGS_max_send_message_bytes);
  o.grpc_memory_limit_bytes = absl::GetFlag(FLAGS_grpc_memory_limit_bytes);
  o.max_stream_buffer_bytes = absl::GetFlag(FLAGS_max_stream_buffer_bytes);
  o.write_stall_timeout = absl::GetFlag(FLAGS_write_stall_timeout);
  o.first_write_timeout = absl::GetFlag(FLAGS_first_write_timeout);
  o.max_open_streams = absl::GetFlag(FLAGS_max_open_streams);
  o.max_open_streams_per_peer = absl::GetFlag(FLAGS_max_open_streams_per_peer);
  o.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  o.reflection = absl::GetFlag(FLAGS_reflection);
  o.self_check_interval = absl::GetFlag(FLAGS_self_check_interval);
  o.keepalive_time_ms = absl::GetFlag(FLAGS_keepalive_time_ms);
  o.keepalive_timeout_ms = absl::GetFlag(FLAGS_keepalive_timeout_ms);
  o.min_client_ping_interval_ms = absl::GetFlag(FLAGS_min_client_ping_interval_ms);
  o.keepalive_permit_without_calls = absl::GetFlag(FLAGS_keepalive_permit_without_calls);
  o.max_connection_idle_ms = absl::GetFlag(FLAGS_max_connection_idle_ms);
  o.max_connection_age_ms = absl::GetFlag(FLAGS_max_connection_age_ms);
  o.api_key_file = absl::GetFlag(FLAGS_api_key_file);
  o.api_key_reload_interval = absl::GetFlag(FLAGS_api_key_reload_interval);
  o.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  o.tls_reload_interval = absl::GetFlag(FLAGS_tls_reload_interval);
  o.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  o.engine_stall_timeout = absl::GetFlag(FLAGS_engine_stall_timeout);
  if (absl::Status s = ValidateServerOptions(o); !s.ok()) return s;
  return o;
}

absl::Status ValidateServerOptions(const ServerOptions& o) {
  auto bad = [](absl::string_view flag, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", what));
  };
  if (o.model_dir.empty()) return bad("model", "must name a model directory");
  if (o.port < 0 || o.port > 65535) return bad("port", "must be in [0, 65535]");
  if (o.metrics_port < 0 || o.metrics_port > 65535) {
    return bad("metrics-port", "must be in [0, 65535]");
  }
  if (o.metrics_port != 0 && o.metrics_port == o.port && o.metrics_host == o.host) {
    return bad("metrics-port", "must differ from --port");
  }
  if (o.http_port < 0 || o.http_port > 65535) return bad("http-port", "must be in [0, 65535]");
  if (o.http_port != 0 && o.http_port == o.port && o.http_host == o.host) {
    return bad("http-port", "must differ from --port");
  }
  if (o.http_port != 0 && o.http_port == o.metrics_port && o.http_host == o.metrics_host) {
    return bad("http-port", "must differ from --metrics-port");
  }
  if (o.engine.block_size < 1) return bad("block-size", "must be >= 1");
  if (!(o.engine.kv_cache_fraction > 0 && o.engine.kv_cache_fraction <= 1)) {
    return bad("kv-cache-fraction", "must be in (0, 1]");
  }
  if (o.engine.max_num_seqs < 1) return bad("max-num-seqs", "must be >= 1");
  if (o.engine.max_num_batched_tokens < 1) return bad("max-batch-tokens", "must be >= 1");
  // At least one waiting request must fit: the warm-up (and every request) is queued first.
  if (o.engine.max_queued_requests < 1) return bad("max-queued-requests", "must be >= 1");
  if (o.engine.max_queued_prompt_tokens < 1) {
    return bad("max-queued-prompt-tokens", "must be >= 1");
  }
  if (o.engine.max_prompt_tokens < 0) return bad("max-prompt-tokens", "must be >= 0");
  if (o.engine.max_new_tokens_limit < 0) return bad("max-new-tokens", "must be >= 0");
  if (o.engine.default_max_new_tokens < 1) {
    return bad("default-max-new-tokens", "must be >= 1");
  }
  // The engine refuses these too, but only after the model is loaded and without the flags'
  // names (EngineOptions' bounds, engine.h).
  if (o.engine.spec_tokens < 0 || o.engine.spec_tokens > kMaxSpecTokens) {
    return bad("spec-tokens", absl::StrCat("must be in [0, ", kMaxSpecTokens, "]"));
  }
  if (o.engine.spec_ngram_min < 1) return bad("spec-ngram-min", "must be >= 1");
  if (o.engine.spec_ngram_max > kMaxSpecNgram) {
    return bad("spec-ngram-max", absl::StrCat("must be at most ", kMaxSpecNgram));
  }
  if (o.engine.spec_ngram_min > o.engine.spec_ngram_max) {
    return bad("spec-ngram-min", "must be <= --spec-ngram-max");
  }
  if (o.engine.spec_max_step_drafts < 0 ||
      o.engine.spec_max_step_drafts > o.engine.max_num_batched_tokens) {
    return bad("spec-max-step-drafts", "must be in [0, --max-batch-tokens]");
  }
  if (o.engine.spec_step_tokens < 0 ||
      o.engine.spec_step_tokens > o.engine.max_num_batched_tokens) {
    return bad("spec-step-tokens", "must be in [0, --max-batch-tokens]");
  }
  // gRPC's own limit is kReceiveLimitMargin more (GrpcReceiveLimit): it must stay an int.
  if (o.max_receive_message_bytes < 1024 || o.max_receive_message_bytes > (1 << 30)) {
    return bad("max-receive-message-bytes", "must be in [1024, 2^30]");
  }
  if (o.max_send_message_bytes < 1024) return bad("max-send-message-bytes", "must be >= 1024");
  // Below a few messages' worth gRPC would cancel ordinary calls.
  if (o.grpc_memory_limit_bytes != 0 &&
      o.grpc_memory_limit_bytes < 4 * int64_t{GrpcReceiveLimit(o)}) {
    return bad("grpc-memory-limit-bytes",
               "must be 0 (no limit) or at least 4 x (--max-receive-message-bytes + 64 KiB)");
  }
  // Output coalesces into one message while a write is in flight: it must stay sendable.
  if (o.max_stream_buffer_bytes < 1024 || o.max_stream_buffer_bytes > o.max_send_message_bytes / 2) {
    return bad("max-stream-buffer-bytes", "must be in [1024, --max-send-message-bytes / 2]");
  }
  if (o.write_stall_timeout <= absl::ZeroDuration()) {
    return bad("write-stall-timeout", "must be > 0");
  }
  if (o.first_write_timeout <= absl::ZeroDuration()) {
    return bad("first-write-timeout", "must be > 0");
  }
  if (o.max_open_streams < 0) return bad("max-open-streams", "must be >= 0");
  if (o.max_open_streams_per_peer < 0) return bad("max-open-streams-per-peer", "must be >= 0");
  if (o.max_concurrent_streams < 0) return bad("max-concurrent-streams", "must be >= 0");
  if (o.self_check_interval < absl::ZeroDuration()) {
    return bad("self-check-interval", "must be >= 0");
  }
  if (o.keepalive_time_ms < 1) return bad("keepalive-time-ms", "must be >= 1");
  if (o.keepalive_timeout_ms < 1) return bad("keepalive-timeout-ms", "must be >= 1");
  if (o.min_client_ping_interval_ms < 0) {
    return bad("min-client-ping-interval-ms", "must be >= 0");
  }
  if (o.max_connection_idle_ms < 0) return bad("max-connection-idle-ms", "must be >= 0");
  if (o.max_connection_age_ms < 0) return bad("max-connection-age-ms", "must be >= 0");
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return bad(o.tls_cert.empty() ? "tls-cert" : "tls-key",
               "--tls-cert and --tls-key go together");
  }
  if (!o.tls_client_ca.empty() && o.tls_cert.empty()) {
    return bad("tls-client-ca", "needs --tls-cert and --tls-key");
  }
  if (o.tls_reload_interval < absl::Seconds(1)) return bad("tls-reload-interval", "must be >= 1s");
  if (o.api_key_reload_interval < absl::Seconds(1)) {
    return bad("api-key-reload-interval", "must be >= 1s");
  }
  if (o.threads < 0 || o.threads > 1024) return bad("threads", "must be in [0, 1024]");
  if (o.drain_timeout < absl::ZeroDuration()) return bad("drain-timeout", "must be >= 0");
  if (o.engine_stall_timeout <= absl::ZeroDuration()) {
    return bad("engine-stall-timeout", "must be > 0");
  }
  return absl::OkStatus();
}

}  // namespace dcf::server
