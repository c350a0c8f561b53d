// Prometheus metrics of the server (prometheus-cpp's registry and text format). The server
// serves ScrapeText() at /metrics on its own HTTP listener (server/http_server.h).
//
// Names follow the vLLM / Kubernetes inference-gateway conventions under a dcformer_ prefix
// (dcformer_num_requests_waiting, dcformer_num_requests_running, dcformer_kv_cache_usage_perc
// are what autoscalers and gateways read). Gauges that mirror the engine's state are
// refreshed from EngineStats at scrape time, so a scrape always sees the current values.
//
// Thread-safety: every method may be called from any thread; the EngineObserver hooks run on
// the engine loop thread and only touch lock-free or briefly locked prometheus-cpp metrics.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/serving/engine.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace dcf::server {

// The front a request came through: the `protocol` label of the request, token and latency
// metrics, and the GenerationRequest::origin the fronts set (the engine hands it back to the
// observer hooks).
enum class Protocol { kGrpc = 0, kHttp = 1 };
inline constexpr int kNumProtocols = 2;
const char* ProtocolLabel(Protocol protocol);

class ServerMetrics : public EngineObserver {
 public:
  ServerMetrics();
  ~ServerMetrics() override;

  // Where scrape-time gauges come from; returns nullopt while no engine runs.
  void SetStatsSource(std::function<std::optional<EngineStats>()> source);
  // Observer hooks record only when enabled (off during warm-up).
  void SetEnabled(bool enabled) { enabled_.store(enabled); }
  // 1 while health reports SERVING.
  void SetServing(bool serving);

  // One scrape in the Prometheus text format (version 0.0.4): refreshes the engine gauges,
  // then serializes every family.
  std::string ScrapeText();

  // --- request accounting (called by the RPC layer) ---
  // One finished call: `outcome` is a finish reason ("eos", "length", ...) or a gRPC code
  // label for calls that failed ("invalid_argument", "resource_exhausted", ...).
  void RecordRequest(absl::string_view outcome, Protocol protocol = Protocol::kGrpc);
  // One finished unary call ("Tokenize", ...): `outcome` is "ok" or a gRPC code label.
  void RecordUnaryRequest(absl::string_view method, absl::string_view outcome);
  void AddPromptTokens(int64_t n, Protocol protocol = Protocol::kGrpc);
  void AddGeneratedTokens(int64_t n, Protocol protocol = Protocol::kGrpc);
  // dcformer_cache_config_info{block_size, num_gpu_blocks} = 1 (vLLM's cache_config_info,
  // which the inference gateway's prefix-aware routing reads): the KV block size in tokens
  // and the blocks of the global layer group's pool.
  void SetCacheConfig(int block_size, int num_blocks);

  // --- credentials and self-checks (called by DcformerServer) ---
  // One reload of `file` ("api_keys", "tls") that changed what is in force (ok), or that
  // failed and left the last good material in force.
  void RecordCredentialReload(absl::string_view file, bool ok);
  // When the TLS certificate in force expires.
  void SetCertificateExpiry(absl::Time not_after);
  // One failed listener self-check (listener_check.h).
  void RecordSelfCheckFailure();
  // A connection of an HTTP listener (`listener`: "metrics", "openai") closed to make room at
  // a connection cap ("evicted") or answered 503 there ("refused"); http_server.h.
  void RecordHttpConnectionEvent(absl::string_view listener, absl::string_view event);

  // Updates the engine-mirroring gauges now (also done at each scrape).
  void Refresh();

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  // --- EngineObserver ---
  void OnStep(int num_seqs, int num_tokens, int num_prefill_tokens,
              absl::Duration step_time) override;
  void OnPreemption() override;
  void OnPrefixCacheQuery(int query_tokens, int hit_tokens) override;
  void OnSpecVerify(int drafted, int accepted) override;
  void OnFirstToken(int origin, absl::Duration ttft) override;
  void OnInterTokenLatency(int origin, absl::Duration itl) override;
  void OnNonFiniteLogits() override;
  void OnFinished(int origin, const GenerationChunk& final_chunk) override;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::atomic<bool> enabled_{false};

  std::mutex source_mu_;
  std::function<std::optional<EngineStats>()> source_;

  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Counter>* unary_requests_;
  prometheus::Family<prometheus::Counter>* credential_reloads_;
  prometheus::Family<prometheus::Counter>* credential_reload_failures_;
  prometheus::Gauge* certificate_expiry_;
  prometheus::Counter* self_check_failures_;
  prometheus::Family<prometheus::Counter>* http_connection_events_;
  prometheus::Counter* prompt_tokens_[kNumProtocols];
  prometheus::Counter* generated_tokens_[kNumProtocols];
  prometheus::Family<prometheus::Gauge>* cache_config_info_;
  prometheus::Counter* preemptions_;
  prometheus::Counter* steps_;
  prometheus::Counter* nonfinite_logits_;
  prometheus::Counter* prefix_queries_;
  prometheus::Counter* prefix_hits_;
  prometheus::Counter* spec_drafted_;
  prometheus::Counter* spec_accepted_;
  prometheus::Histogram* spec_accepted_length_;
  prometheus::Family<prometheus::Gauge>* prefix_blocks_;
  // Mirrors EngineStats::prefix_cache_evictions; refresh_mu_ keeps two scrapes from adding
  // the same difference twice.
  prometheus::Family<prometheus::Counter>* prefix_evictions_;
  std::mutex refresh_mu_;
  prometheus::Gauge* waiting_;
  prometheus::Gauge* running_;
  prometheus::Gauge* kv_usage_;
  prometheus::Gauge* serving_;
  prometheus::Gauge* engine_alive_;
  prometheus::Family<prometheus::Gauge>* kv_blocks_used_;
  prometheus::Family<prometheus::Gauge>* kv_blocks_total_;
  prometheus::Family<prometheus::Gauge>* kv_usage_by_group_;
  prometheus::Histogram* ttft_[kNumProtocols];
  prometheus::Histogram* itl_[kNumProtocols];
  prometheus::Histogram* e2e_[kNumProtocols];
  prometheus::Histogram* queue_time_[kNumProtocols];
  prometheus::Histogram* batch_size_;
  prometheus::Histogram* batch_tokens_;
  prometheus::Histogram* step_time_;
};

}  // namespace dcf::server
