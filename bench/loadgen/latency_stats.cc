#include "bench/loadgen/latency_stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/common/logging.h"

namespace dcf::loadgen {

double Percentile(const std::vector<double>& sorted, double p) {
  DCF_CHECK(!sorted.empty());
  DCF_CHECK(p >= 0.0 && p <= 1.0) << "p=" << p;
  const double h = static_cast<double>(sorted.size() - 1) * p;
  const size_t lo = static_cast<size_t>(std::floor(h));
  if (lo + 1 >= sorted.size()) return sorted.back();
  return sorted[lo] + (h - static_cast<double>(lo)) * (sorted[lo + 1] - sorted[lo]);
}

LatencySummary Summarize(std::vector<double> samples) {
  LatencySummary s;
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  s.count = static_cast<int64_t>(samples.size());
  s.mean = std::accumulate(samples.begin(), samples.end(), 0.0) / static_cast<double>(s.count);
  s.min = samples.front();
  s.p50 = Percentile(samples, 0.50);
  s.p90 = Percentile(samples, 0.90);
  s.p99 = Percentile(samples, 0.99);
  s.max = samples.back();
  return s;
}

}  // namespace dcf::loadgen
