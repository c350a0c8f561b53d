// Prometheus metrics of the server (prometheus-cpp), exposed over HTTP at /metrics.
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
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace dcf::server {

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

  // Serves /metrics on `host:port` (e.g. "127.0.0.1:9090").
  absl::Status StartExposer(const std::string& host_port);

  // --- request accounting (called by the RPC layer) ---
  // One finished call: `outcome` is a finish reason ("eos", "length", ...) or a gRPC code
  // label for calls that failed ("invalid_argument", "resource_exhausted", ...).
  void RecordRequest(absl::string_view outcome);
  // One finished unary call ("Tokenize", ...): `outcome` is "ok" or a gRPC code label.
  void RecordUnaryRequest(absl::string_view method, absl::string_view outcome);
  void AddPromptTokens(int64_t n);
  void AddGeneratedTokens(int64_t n);

  // Updates the engine-mirroring gauges now (also done at each scrape).
  void Refresh();

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  // --- EngineObserver ---
  void OnStep(int num_seqs, int num_tokens, int num_prefill_tokens,
              absl::Duration step_time) override;
  void OnPreemption() override;
  void OnFirstToken(absl::Duration ttft) override;
  void OnInterTokenLatency(absl::Duration itl) override;
  void OnNonFiniteLogits() override;
  void OnFinished(const GenerationChunk& final_chunk) override;

 private:
  class RefreshingCollectable;

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<RefreshingCollectable> collectable_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::atomic<bool> enabled_{false};

  std::mutex source_mu_;
  std::function<std::optional<EngineStats>()> source_;

  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Counter>* unary_requests_;
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* generated_tokens_;
  prometheus::Counter* preemptions_;
  prometheus::Counter* steps_;
  prometheus::Counter* nonfinite_logits_;
  prometheus::Gauge* waiting_;
  prometheus::Gauge* running_;
  prometheus::Gauge* kv_usage_;
  prometheus::Gauge* serving_;
  prometheus::Gauge* engine_alive_;
  prometheus::Family<prometheus::Gauge>* kv_blocks_used_;
  prometheus::Family<prometheus::Gauge>* kv_blocks_total_;
  prometheus::Family<prometheus::Gauge>* kv_usage_by_group_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* itl_;
  prometheus::Histogram* e2e_;
  prometheus::Histogram* queue_time_;
  prometheus::Histogram* batch_size_;
  prometheus::Histogram* batch_tokens_;
  prometheus::Histogram* step_time_;
};

}  // namespace dcf::server
