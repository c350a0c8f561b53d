#include "server/metrics.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"

namespace dcf::server {
namespace {

// Latency buckets, seconds: fine below 10 ms (CPU decode steps of small models are ~1 ms),
// then coarser up to 20 minutes: long generations (thousands of tokens, a full queue) run
// for minutes, and a quantile above the last finite bucket is clamped to it.
prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01,  0.015,
          0.02,   0.03,  0.05,   0.075, 0.1,   0.15,  0.2,   0.3,    0.5,   0.75,
          1.0,    2.5,   5.0,    10.0,  20.0,  30.0,  60.0,  120.0,  300.0, 600.0,
          1200.0};
}

const char* kOutcomes[] = {"eos",         "stop_token",         "stop_string",
                           "length",      "cancelled",          "deadline_exceeded",
                           "error",       "invalid_argument",   "out_of_range",
                           "unavailable", "resource_exhausted", "unauthenticated"};

const char* GroupLabel(int g) { return g == 0 ? "global" : "window"; }

int ProtocolIndex(int origin) { return origin == static_cast<int>(Protocol::kHttp) ? 1 : 0; }

}  // namespace

const char* ProtocolLabel(Protocol protocol) {
  return protocol == Protocol::kHttp ? "http" : "grpc";
}

ServerMetrics::ServerMetrics() : registry_(std::make_shared<prometheus::Registry>()) {
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;
  auto& r = *registry_;
  requests_ = &BuildCounter()
                   .Name("dcformer_requests_total")
                   .Help("Generation requests by outcome (a finish reason, or the gRPC code of a "
                         "call that failed or was rejected) and protocol (grpc, http)")
                   .Register(r);
  for (const char* o : kOutcomes) {
    for (int p = 0; p < kNumProtocols; ++p) {
      requests_->Add({{"outcome", o}, {"protocol", ProtocolLabel(static_cast<Protocol>(p))}});
    }
  }
  unary_requests_ = &BuildCounter()
                         .Name("dcformer_unary_requests_total")
                         .Help("Tokenize, Detokenize and GetModelInfo calls by method and "
                               "outcome (ok or the gRPC code of the failure)")
                         .Register(r);
  credential_reloads_ = &BuildCounter()
                             .Name("dcformer_credential_reloads_total")
                             .Help("Reloads of --api-key-file (file=api_keys) or the TLS files "
                                   "(file=tls) that changed what is in force")
                             .Register(r);
  credential_reload_failures_ =
      &BuildCounter()
           .Name("dcformer_credential_reload_failures_total")
           .Help("Reloads that found a file unreadable or invalid and kept the last good one "
                 "in force, by file (api_keys, tls)")
           .Register(r);
  for (const char* file : {"api_keys", "tls"}) {
    credential_reloads_->Add({{"file", file}});
    credential_reload_failures_->Add({{"file", file}});
  }
  certificate_expiry_ = &BuildGauge()
                             .Name("dcformer_tls_certificate_expiry_timestamp_seconds")
                             .Help("When the TLS certificate in force expires (Unix time; 0 "
                                   "without TLS)")
                             .Register(r)
                             .Add({});
  self_check_failures_ = &BuildCounter()
                              .Name("dcformer_self_check_failures_total")
                              .Help("Connections the server made to its own gRPC port that "
                                    "its listener did not accept")
                              .Register(r)
                              .Add({});
  http_connection_events_ =
      &BuildCounter()
           .Name("dcformer_http_connection_events_total")
           .Help("Connections of an HTTP listener (metrics, openai) closed to make room at a "
                 "connection cap (event=evicted) or answered 503 there (event=refused)")
           .Register(r);
  for (const char* listener : {"metrics", "openai"}) {
    for (const char* event : {"evicted", "refused"}) {
      http_connection_events_->Add({{"listener", listener}, {"event", event}});
    }
  }
  auto& prompt_tokens = BuildCounter()
                            .Name("dcformer_prompt_tokens_total")
                            .Help("Prompt tokens of accepted Generate requests, by protocol")
                            .Register(r);
  auto& generated_tokens = BuildCounter()
                               .Name("dcformer_generation_tokens_total")
                               .Help("Tokens generated and streamed to clients, by protocol")
                               .Register(r);
  for (int p = 0; p < kNumProtocols; ++p) {
    const std::map<std::string, std::string> labels = {
        {"protocol", ProtocolLabel(static_cast<Protocol>(p))}};
    prompt_tokens_[p] = &prompt_tokens.Add(labels);
    generated_tokens_[p] = &generated_tokens.Add(labels);
  }
  cache_config_info_ = &BuildGauge()
                            .Name("dcformer_cache_config_info")
                            .Help("1, labelled with the KV cache's block size (tokens) and its "
                                  "blocks (the global layer group's pool), as vLLM's "
                                  "cache_config_info")
                            .Register(r);
  preemptions_ = &BuildCounter()
                      .Name("dcformer_num_preemptions_total")
                      .Help("Sequences preempted (KV blocks reclaimed, recomputed later)")
                      .Register(r)
                      .Add({});
  steps_ = &BuildCounter()
                .Name("dcformer_engine_steps_total")
                .Help("Engine steps run")
                .Register(r)
                .Add({});
  nonfinite_logits_ = &BuildCounter()
                           .Name("dcformer_nonfinite_logits_total")
                           .Help("Requests ended with an error because the model's logits were "
                                 "not finite (NaN or infinity): corrupt weights or an overflow")
                           .Register(r)
                           .Add({});
  prefix_queries_ = &BuildCounter()
                         .Name("dcformer_prefix_cache_queries_total")
                         .Help("Tokens looked up in the prefix cache: the known tokens of each "
                               "admitted sequence (readmissions after preemption included)")
                         .Register(r)
                         .Add({});
  prefix_hits_ = &BuildCounter()
                      .Name("dcformer_prefix_cache_hits_total")
                      .Help("Tokens of those lookups found in the prefix cache (not computed)")
                      .Register(r)
                      .Add({});
  spec_drafted_ = &BuildCounter()
                       .Name("dcformer_spec_drafted_tokens_total")
                       .Help("Speculative decoding: drafted tokens sent to verification")
                       .Register(r)
                       .Add({});
  spec_accepted_ = &BuildCounter()
                        .Name("dcformer_spec_accepted_tokens_total")
                        .Help("Speculative decoding: drafted tokens accepted (equal to the "
                              "token plain decoding samples there)")
                        .Register(r)
                        .Add({});
  prefix_blocks_ = &BuildGauge()
                        .Name("dcformer_prefix_cache_blocks")
                        .Help("KV-cache blocks that hold a cached prefix (in use or free; a "
                              "free one is evicted when a new block is needed), per layer group")
                        .Register(r);
  prefix_evictions_ = &BuildCounter()
                           .Name("dcformer_prefix_cache_evictions_total")
                           .Help("Cached blocks evicted to make room for new ones, per layer "
                                 "group")
                           .Register(r);
  for (int g = 0; g < kNumLayerGroups; ++g) {
    prefix_blocks_->Add({{"layer_group", GroupLabel(g)}});
    prefix_evictions_->Add({{"layer_group", GroupLabel(g)}});
  }
  waiting_ = &BuildGauge()
                  .Name("dcformer_num_requests_waiting")
                  .Help("Requests queued and not yet scheduled")
                  .Register(r)
                  .Add({});
  running_ = &BuildGauge()
                  .Name("dcformer_num_requests_running")
                  .Help("Requests being prefilled or decoded")
                  .Register(r)
                  .Add({});
  kv_usage_ = &BuildGauge()
                   .Name("dcformer_kv_cache_usage_perc")
                   .Help("KV-cache usage, 0 to 1: the fuller of the layer groups")
                   .Register(r)
                   .Add({});
  serving_ = &BuildGauge()
                  .Name("dcformer_serving")
                  .Help("1 while the health service reports SERVING")
                  .Register(r)
                  .Add({});
  engine_alive_ = &BuildGauge()
                       .Name("dcformer_engine_loop_alive")
                       .Help("1 while the engine loop thread runs")
                       .Register(r)
                       .Add({});
  kv_blocks_used_ = &BuildGauge()
                         .Name("dcformer_kv_cache_blocks_used")
                         .Help("KV-cache blocks in use, per layer group")
                         .Register(r);
  kv_blocks_total_ = &BuildGauge()
                          .Name("dcformer_kv_cache_blocks_total")
                          .Help("KV-cache blocks allocated, per layer group")
                          .Register(r);
  kv_usage_by_group_ = &BuildGauge()
                            .Name("dcformer_kv_cache_usage_perc_by_group")
                            .Help("KV-cache usage, 0 to 1, per layer group")
                            .Register(r);
  auto histogram = [&](const char* name, const char* help,
                       prometheus::Histogram::BucketBoundaries buckets) {
    return &BuildHistogram().Name(name).Help(help).Register(r).Add({}, std::move(buckets));
  };
  auto by_protocol = [&](const char* name, const char* help, prometheus::Histogram** out) {
    auto& family = BuildHistogram().Name(name).Help(help).Register(r);
    for (int p = 0; p < kNumProtocols; ++p) {
      out[p] = &family.Add({{"protocol", ProtocolLabel(static_cast<Protocol>(p))}},
                           LatencyBuckets());
    }
  };
  by_protocol("dcformer_time_to_first_token_seconds",
              "Time from queueing to the first generated token", ttft_);
  by_protocol("dcformer_inter_token_latency_seconds",
              "Time between consecutive tokens of a request", itl_);
  by_protocol("dcformer_e2e_request_latency_seconds",
              "Time from queueing to the end of a request", e2e_);
  by_protocol("dcformer_request_queue_time_seconds",
              "Time a request waited before its first engine step", queue_time_);
  batch_size_ = histogram("dcformer_batch_size", "Sequences per engine step",
                          {1, 2, 4, 8, 16, 32, 64, 128, 256});
  batch_tokens_ = histogram("dcformer_batch_tokens", "Tokens per engine step",
                            {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096});
  step_time_ = histogram("dcformer_engine_step_duration_seconds",
                         "Wall time of one engine step (with pipelined steps, from the "
                         "end of the previous one: the times never overlap)",
                         LatencyBuckets());
  spec_accepted_length_ =
      histogram("dcformer_spec_accepted_length",
                "Speculative decoding: drafted tokens accepted per verify of one sequence",
                {0, 1, 2, 3, 4, 6, 8, 12, 16});
}

ServerMetrics::~ServerMetrics() = default;

void ServerMetrics::SetStatsSource(std::function<std::optional<EngineStats>()> source) {
  std::lock_guard<std::mutex> lock(source_mu_);
  source_ = std::move(source);
}

void ServerMetrics::SetServing(bool serving) { serving_->Set(serving ? 1 : 0); }

std::string ServerMetrics::ScrapeText() {
  Refresh();
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

void ServerMetrics::RecordRequest(absl::string_view outcome, Protocol protocol) {
  requests_->Add({{"outcome", std::string(outcome)}, {"protocol", ProtocolLabel(protocol)}})
      .Increment();
}
void ServerMetrics::RecordUnaryRequest(absl::string_view method, absl::string_view outcome) {
  unary_requests_->Add({{"method", std::string(method)}, {"outcome", std::string(outcome)}})
      .Increment();
}
void ServerMetrics::AddPromptTokens(int64_t n, Protocol protocol) {
  prompt_tokens_[static_cast<int>(protocol)]->Increment(n);
}
void ServerMetrics::SetCacheConfig(int block_size, int num_blocks) {
  cache_config_info_
      ->Add({{"block_size", std::to_string(block_size)},
             {"num_gpu_blocks", std::to_string(num_blocks)}})
      .Set(1);
}
void ServerMetrics::RecordCredentialReload(absl::string_view file, bool ok) {
  (ok ? credential_reloads_ : credential_reload_failures_)
      ->Add({{"file", std::string(file)}})
      .Increment();
}
void ServerMetrics::SetCertificateExpiry(absl::Time not_after) {
  certificate_expiry_->Set(static_cast<double>(absl::ToUnixSeconds(not_after)));
}
void ServerMetrics::RecordSelfCheckFailure() { self_check_failures_->Increment(); }
void ServerMetrics::RecordHttpConnectionEvent(absl::string_view listener,
                                              absl::string_view event) {
  http_connection_events_->Add({{"listener", std::string(listener)}, {"event", std::string(event)}})
      .Increment();
}
void ServerMetrics::AddGeneratedTokens(int64_t n, Protocol protocol) {
  generated_tokens_[static_cast<int>(protocol)]->Increment(n);
}

void ServerMetrics::Refresh() {
  std::optional<EngineStats> stats;
  {
    std::lock_guard<std::mutex> lock(source_mu_);
    if (source_) stats = source_();
  }
  if (!stats.has_value()) return;
  waiting_->Set(stats->num_waiting);
  running_->Set(stats->num_running);
  engine_alive_->Set(stats->loop_alive ? 1 : 0);
  double worst = 0;
  for (int g = 0; g < kNumLayerGroups; ++g) {
    const int total = stats->kv_blocks_total[g];
    const int used = stats->kv_blocks_used[g];
    const std::map<std::string, std::string> labels = {{"layer_group", GroupLabel(g)}};
    kv_blocks_used_->Add(labels).Set(used);
    kv_blocks_total_->Add(labels).Set(total);
    const double usage = total > 0 ? static_cast<double>(used) / total : 0.0;
    kv_usage_by_group_->Add(labels).Set(usage);
    worst = std::max(worst, usage);
    prefix_blocks_->Add(labels).Set(stats->kv_blocks_cached[g]);
    std::lock_guard<std::mutex> lock(refresh_mu_);
    prometheus::Counter& evictions = prefix_evictions_->Add(labels);
    const double delta = static_cast<double>(stats->prefix_cache_evictions[g]) - evictions.Value();
    if (delta > 0) evictions.Increment(delta);
  }
  kv_usage_->Set(worst);
}

void ServerMetrics::OnStep(int num_seqs, int num_tokens, int num_prefill_tokens,
                           absl::Duration step_time) {
  if (!enabled_.load(std::memory_order_relaxed)) return;
  steps_->Increment();
  batch_size_->Observe(num_seqs);
  batch_tokens_->Observe(num_tokens);
  step_time_->Observe(absl::ToDoubleSeconds(step_time));
}
void ServerMetrics::OnPreemption() {
  if (enabled_.load(std::memory_order_relaxed)) preemptions_->Increment();
}
void ServerMetrics::OnPrefixCacheQuery(int query_tokens, int hit_tokens) {
  if (!enabled_.load(std::memory_order_relaxed)) return;
  prefix_queries_->Increment(query_tokens);
  prefix_hits_->Increment(hit_tokens);
}
void ServerMetrics::OnSpecVerify(int drafted, int accepted) {
  if (!enabled_.load(std::memory_order_relaxed)) return;
  spec_drafted_->Increment(drafted);
  spec_accepted_->Increment(accepted);
  spec_accepted_length_->Observe(accepted);
}
void ServerMetrics::OnFirstToken(int origin, absl::Duration ttft) {
  if (!enabled_.load(std::memory_order_relaxed)) return;
  ttft_[ProtocolIndex(origin)]->Observe(absl::ToDoubleSeconds(ttft));
}
void ServerMetrics::OnInterTokenLatency(int origin, absl::Duration itl) {
  if (!enabled_.load(std::memory_order_relaxed)) return;
  itl_[ProtocolIndex(origin)]->Observe(absl::ToDoubleSeconds(itl));
}
void ServerMetrics::OnNonFiniteLogits() {
  if (enabled_.load(std::memory_order_relaxed)) nonfinite_logits_->Increment();
}
void ServerMetrics::OnFinished(int origin, const GenerationChunk& final_chunk) {
  if (!enabled_.load(std::memory_order_relaxed)) return;
  e2e_[ProtocolIndex(origin)]->Observe(absl::ToDoubleSeconds(final_chunk.timing.total));
  queue_time_[ProtocolIndex(origin)]->Observe(
      absl::ToDoubleSeconds(final_chunk.timing.queue_time));
}

}  // namespace dcf::server
