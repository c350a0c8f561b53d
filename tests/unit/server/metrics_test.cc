#include "server/metrics.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "gtest/gtest.h"

namespace dcf::server {
namespace {

// The value of the first series of `name` whose first label has `label_value` (any when
// empty) and, when `protocol` is set, whose protocol label is it.
double Value(const prometheus::Registry& registry, const std::string& name,
             const std::string& label_value = "", const std::string& protocol = "grpc") {
  for (const auto& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const auto& m : family.metric) {
      if (!label_value.empty() &&
          (m.label.empty() || m.label[0].value != label_value)) {
        continue;
      }
      bool other_protocol = false;
      for (const auto& l : m.label) other_protocol |= l.name == "protocol" && l.value != protocol;
      if (other_protocol) continue;
      switch (family.type) {
        case prometheus::MetricType::Counter: return m.counter.value;
        case prometheus::MetricType::Gauge: return m.gauge.value;
        case prometheus::MetricType::Histogram: return m.histogram.sample_count;
        default: return -1;
      }
    }
  }
  return -1;
}

TEST(ServerMetricsTest, HasTheGatewayNames) {
  ServerMetrics metrics;
  std::set<std::string> names;
  for (const auto& f : metrics.registry()->Collect()) names.insert(f.name);
  for (const char* n : {"dcformer_num_requests_waiting", "dcformer_num_requests_running",
                        "dcformer_kv_cache_usage_perc", "dcformer_requests_total",
                        "dcformer_time_to_first_token_seconds",
                        "dcformer_inter_token_latency_seconds",
                        "dcformer_e2e_request_latency_seconds",
                        "dcformer_request_queue_time_seconds", "dcformer_prompt_tokens_total",
                        "dcformer_generation_tokens_total", "dcformer_batch_size",
                        "dcformer_num_preemptions_total", "dcformer_engine_step_duration_seconds",
                        "dcformer_nonfinite_logits_total", "dcformer_prefix_cache_queries_total",
                        "dcformer_prefix_cache_hits_total", "dcformer_prefix_cache_blocks",
                        "dcformer_prefix_cache_evictions_total"}) {
    EXPECT_TRUE(names.count(n)) << n;
  }
}

// The latency histograms resolve minutes-long generations: a quantile above the last finite
// bucket is clamped to it, so p99 of long requests must not saturate at a minute.
TEST(ServerMetricsTest, LatencyBucketsReachLongGenerations) {
  ServerMetrics metrics;
  int checked = 0;
  for (const auto& family : metrics.registry()->Collect()) {
    if (family.name != "dcformer_e2e_request_latency_seconds" &&
        family.name != "dcformer_time_to_first_token_seconds" &&
        family.name != "dcformer_request_queue_time_seconds") {
      continue;
    }
    ASSERT_EQ(family.metric.size(), 2u) << family.name;  // protocol grpc and http
    double last_finite = 0;
    for (const auto& b : family.metric[0].histogram.bucket) {
      if (std::isfinite(b.upper_bound)) last_finite = std::max(last_finite, b.upper_bound);
    }
    EXPECT_GE(last_finite, 1200.0) << family.name;
    ++checked;
  }
  EXPECT_EQ(checked, 3);
}

TEST(ServerMetricsTest, RefreshMirrorsEngineStats) {
  ServerMetrics metrics;
  EngineStats stats;
  stats.num_waiting = 3;
  stats.num_running = 2;
  stats.kv_blocks_total = {100, 10};
  stats.kv_blocks_used = {25, 5};
  stats.loop_alive = true;
  metrics.SetStatsSource([&]() -> std::optional<EngineStats> { return stats; });
  metrics.Refresh();
  const auto& r = *metrics.registry();
  EXPECT_EQ(Value(r, "dcformer_num_requests_waiting"), 3);
  EXPECT_EQ(Value(r, "dcformer_num_requests_running"), 2);
  EXPECT_DOUBLE_EQ(Value(r, "dcformer_kv_cache_usage_perc"), 0.5);  // the fuller group
  EXPECT_EQ(Value(r, "dcformer_kv_cache_blocks_used", "global"), 25);
  EXPECT_EQ(Value(r, "dcformer_kv_cache_blocks_used", "window"), 5);
  EXPECT_EQ(Value(r, "dcformer_prefix_cache_blocks", "global"), 0);
  // Cached blocks are a gauge; evictions a counter that follows the engine's count.
  stats.kv_blocks_cached = {40, 7};
  stats.prefix_cache_evictions = {12, 3};
  metrics.Refresh();
  metrics.Refresh();  // a second scrape adds nothing
  EXPECT_EQ(Value(r, "dcformer_prefix_cache_blocks", "global"), 40);
  EXPECT_EQ(Value(r, "dcformer_prefix_cache_blocks", "window"), 7);
  EXPECT_EQ(Value(r, "dcformer_prefix_cache_evictions_total", "global"), 12);
  EXPECT_EQ(Value(r, "dcformer_prefix_cache_evictions_total", "window"), 3);
  stats.prefix_cache_evictions = {20, 3};
  metrics.Refresh();
  EXPECT_EQ(Value(r, "dcformer_prefix_cache_evictions_total", "global"), 20);
}

TEST(ServerMetricsTest, ObserverRecordsOnlyWhenEnabled) {
  ServerMetrics metrics;
  metrics.OnFirstToken(0, absl::Milliseconds(3));  // warm-up: ignored
  metrics.OnNonFiniteLogits();                  // ignored too
  metrics.OnPrefixCacheQuery(100, 100);         // ignored too
  metrics.OnSpecVerify(4, 4);                   // ignored too
  metrics.SetEnabled(true);
  metrics.OnSpecVerify(4, 1);
  metrics.OnSpecVerify(8, 8);
  metrics.OnNonFiniteLogits();
  metrics.OnNonFiniteLogits();
  metrics.OnFirstToken(0, absl::Milliseconds(3));
  metrics.OnFirstToken(static_cast<int>(Protocol::kHttp), absl::Milliseconds(3));
  metrics.OnFirstToken(static_cast<int>(Protocol::kHttp), absl::Milliseconds(4));
  metrics.OnStep(4, 4, 0, absl::Milliseconds(1));
  metrics.OnPreemption();
  metrics.OnPrefixCacheQuery(40, 32);
  metrics.OnPrefixCacheQuery(10, 0);
  metrics.RecordRequest("length");
  metrics.AddGeneratedTokens(7);
  metrics.RecordRequest("length", Protocol::kHttp);
  metrics.RecordRequest("length", Protocol::kHttp);
  metrics.AddGeneratedTokens(5, Protocol::kHttp);
  metrics.SetCacheConfig(16, 1234);
  const auto& r = *metrics.registry();
  EXPECT_EQ(Value(r, "dcformer_time_to_first_token_seconds"), 1);
  EXPECT_EQ(Value(r, "dcformer_time_to_first_token_seconds", "", "http"), 2);
  EXPECT_EQ(Value(r, "dcformer_requests_total", "length", "http"), 2);
  EXPECT_EQ(Value(r, "dcformer_generation_tokens_total", "", "http"), 5);
  EXPECT_EQ(Value(r, "dcformer_cache_config_info", "16"), 1);
  const std::string text = metrics.ScrapeText();
  EXPECT_NE(text.find("dcformer_cache_config_info{block_size=\"16\",num_gpu_blocks=\"1234\"} 1"),
            std::string::npos);
  EXPECT_EQ(Value(r, "dcformer_batch_size"), 1);
  EXPECT_EQ(Value(r, "dcformer_spec_drafted_tokens_total"), 12);
  EXPECT_EQ(Value(r, "dcformer_spec_accepted_tokens_total"), 9);
  EXPECT_EQ(Value(r, "dcformer_spec_accepted_length"), 2);
  EXPECT_EQ(Value(r, "dcformer_num_preemptions_total"), 1);
  EXPECT_EQ(Value(r, "dcformer_requests_total", "length"), 1);
  EXPECT_EQ(Value(r, "dcformer_generation_tokens_total"), 7);
  EXPECT_EQ(Value(r, "dcformer_nonfinite_logits_total"), 2);
  EXPECT_EQ(Value(r, "dcformer_prefix_cache_queries_total"), 50);
  EXPECT_EQ(Value(r, "dcformer_prefix_cache_hits_total"), 32);
}

}  // namespace
}  // namespace dcf::server
