#include "bench/loadgen/poisson_arrivals.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace dcf::loadgen {
namespace {

// Exponential gaps with mean 1/rate: sample mean, standard deviation (= mean for an
// exponential) and P(gap < mean) = 1 - 1/e. With n = 200000 the standard error of the mean
// is 0.22% of it; the tolerances are several standard errors wide.
TEST(PoissonArrivalsTest, GapsAreExponentialWithMeanOneOverRate) {
  for (double rate : {0.5, 4.0, 250.0}) {
    SCOPED_TRACE(rate);
    PoissonArrivals arrivals(rate, /*seed=*/42);
    const int n = 200000;
    std::vector<double> gaps(n);
    double sum = 0;
    for (double& g : gaps) {
      g = arrivals.NextGapSeconds();
      ASSERT_GE(g, 0.0);
      ASSERT_TRUE(std::isfinite(g));
      sum += g;
    }
    const double mean = sum / n;
    EXPECT_NEAR(mean * rate, 1.0, 0.01);
    double var = 0;
    int below_mean = 0;
    for (double g : gaps) {
      var += (g - mean) * (g - mean);
      below_mean += g < 1.0 / rate;
    }
    EXPECT_NEAR(std::sqrt(var / (n - 1)) * rate, 1.0, 0.02);
    EXPECT_NEAR(static_cast<double>(below_mean) / n, 1.0 - std::exp(-1.0), 0.005);
  }
}

TEST(PoissonArrivalsTest, SeedFixesTheSchedule) {
  PoissonArrivals a(3.0, 7), b(3.0, 7), c(3.0, 8);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const double x = a.NextGapSeconds();
    EXPECT_EQ(x, b.NextGapSeconds());
    differs |= x != c.NextGapSeconds();
  }
  EXPECT_TRUE(differs);
}

}  // namespace
}  // namespace dcf::loadgen
