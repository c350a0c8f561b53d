#include "bench/loadgen/latency_stats.h"

#include "gtest/gtest.h"

namespace dcf::loadgen {
namespace {

TEST(PercentileTest, InterpolatesLinearlyBetweenClosestRanks) {
  const std::vector<double> v = {1, 2, 3, 4};
  EXPECT_DOUBLE_EQ(Percentile(v, 0.0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(Percentile(v, 1.0), 4);
  EXPECT_DOUBLE_EQ(Percentile(v, 0.25), 1.75);  // h = 0.75
  std::vector<double> ten;
  for (int i = 1; i <= 10; ++i) ten.push_back(i);
  EXPECT_DOUBLE_EQ(Percentile(ten, 0.9), 9.1);    // h = 8.1
  EXPECT_DOUBLE_EQ(Percentile(ten, 0.99), 9.91);  // h = 8.91
  EXPECT_DOUBLE_EQ(Percentile({7}, 0.99), 7);
}

TEST(SummarizeTest, UnorderedSamples) {
  std::vector<double> v;
  for (int i = 100; i >= 0; --i) v.push_back(i);  // 0..100, reversed
  const LatencySummary s = Summarize(v);
  EXPECT_EQ(s.count, 101);
  EXPECT_DOUBLE_EQ(s.mean, 50);
  EXPECT_DOUBLE_EQ(s.min, 0);
  EXPECT_DOUBLE_EQ(s.p50, 50);
  EXPECT_DOUBLE_EQ(s.p90, 90);
  EXPECT_DOUBLE_EQ(s.p99, 99);
  EXPECT_DOUBLE_EQ(s.max, 100);
}

TEST(SummarizeTest, SkewedSamplesKeepPercentilesOrdered) {
  std::vector<double> v(990, 1.0);
  v.insert(v.end(), 10, 1000.0);  // 1% outliers
  const LatencySummary s = Summarize(v);
  EXPECT_DOUBLE_EQ(s.p50, 1.0);
  EXPECT_DOUBLE_EQ(s.p90, 1.0);
  EXPECT_GT(s.p99, 1.0);  // h = 989.01: between the last 1 and the first 1000
  EXPECT_LT(s.p99, 1000.0);
  EXPECT_NEAR(s.mean, 10.99, 1e-9);
}

TEST(SummarizeTest, EmptyIsAllZero) {
  const LatencySummary s = Summarize({});
  EXPECT_EQ(s.count, 0);
  EXPECT_EQ(s.p99, 0);
  EXPECT_EQ(s.mean, 0);
}

}  // namespace
}  // namespace dcf::loadgen
