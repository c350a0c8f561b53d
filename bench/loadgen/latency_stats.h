// Summary statistics of latency samples (milliseconds): count, mean, min, p50, p90, p99, max.
//
// Percentiles interpolate linearly between the two closest ranks (NumPy's default "linear"
// method): for n ascending samples x[0..n-1] and p in [0, 1], h = (n - 1) * p and the value is
// x[floor(h)] + (h - floor(h)) * (x[floor(h) + 1] - x[floor(h)]). So p50 of {1, 2, 3, 4} is 2.5,
// p0 is the minimum and p100 the maximum. Pure functions; thread-compatible.
#pragma once

#include <cstdint>
#include <vector>

namespace dcf::loadgen {

struct LatencySummary {
  int64_t count = 0;  // samples; every other field is 0 when there are none
  double mean = 0;
  double min = 0;
  double p50 = 0;
  double p90 = 0;
  double p99 = 0;
  double max = 0;
};

// The p-quantile (p in [0, 1]) of `sorted` (ascending, non-empty) as defined above.
double Percentile(const std::vector<double>& sorted, double p);

// The summary of `samples` (any order).
LatencySummary Summarize(std::vector<double> samples);

}  // namespace dcf::loadgen
