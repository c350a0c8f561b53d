#include <algorithm>
#include <climits>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/simt/cuda_test_util.h"
#include "tests/unit/simt/test_kernels.h"

namespace dcf::cuda_test {
namespace {

TEST(AtomicsTest, MultiBlockHistogramMatchesHost) {
  const int n = 10000;
  const int bins = 37;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> dist(0, bins - 1);
  std::vector<int> values(n);
  for (int& v : values) v = dist(rng);
  values[123] = bins - 1;  // make sure both extremes occur
  values[456] = 0;

  DeviceBuffer<int> d_values(values);
  DeviceBuffer<int> hist(std::vector<int>(bins, 0));
  DeviceBuffer<unsigned long long> total(std::vector<unsigned long long>{0});
  DeviceBuffer<int> max_value(std::vector<int>{INT_MIN});
  DeviceBuffer<int> min_value(std::vector<int>{INT_MAX});
  DeviceBuffer<unsigned int> umax(std::vector<unsigned int>{0});
  DeviceBuffer<float> fsum(std::vector<float>{0.0f});
  const HistogramOut out{hist.get(),      total.get(), max_value.get(),
                         min_value.get(), umax.get(),  fsum.get()};
  ASSERT_TRUE(CudaOk(LaunchHistogram(d_values.get(), n, bins, out, 8, 128, nullptr)));
  ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));

  std::vector<int> want(bins, 0);
  for (int v : values) ++want[v];
  EXPECT_EQ(hist.ToHost(), want);
  EXPECT_EQ(total.ToHost()[0], static_cast<unsigned long long>(n));
  EXPECT_EQ(max_value.ToHost()[0], bins - 1);
  EXPECT_EQ(min_value.ToHost()[0], 0);
  EXPECT_EQ(umax.ToHost()[0], static_cast<unsigned int>(bins - 1));
  EXPECT_EQ(fsum.ToHost()[0], static_cast<float>(n));  // integers below 2^24 add exactly
}

TEST(AtomicsTest, CasLoopCountsEveryThreadAndExchangeLosesNoValue) {
  const int blocks = 6;
  const int threads = 96;
  const unsigned int total = blocks * threads;
  const unsigned int initial = 1000000;
  DeviceBuffer<int> counter(std::vector<int>{5});
  DeviceBuffer<unsigned int> slot(std::vector<unsigned int>{initial});
  DeviceBuffer<unsigned int> olds(total);
  ASSERT_TRUE(
      CudaOk(LaunchCasExch(counter.get(), slot.get(), olds.get(), blocks, threads, nullptr)));
  ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
  EXPECT_EQ(counter.ToHost()[0], 5 + static_cast<int>(total));
  // The exchanges form a chain: the old values plus the final one are every id plus the
  // initial value, each exactly once.
  std::vector<unsigned int> seen = olds.ToHost();
  seen.push_back(slot.ToHost()[0]);
  std::sort(seen.begin(), seen.end());
  std::vector<unsigned int> want(total);
  std::iota(want.begin(), want.end(), 0u);
  want.push_back(initial);
  EXPECT_EQ(seen, want);
}

#if defined(DCF_CUDA_SIM)
// The emulator may run a grid's blocks on several OS threads: atomics stay exact and a
// violation in any block still stops the launch.
TEST(AtomicsTest, SeveralWorkerThreads) {
  const int saved = simt::WorkerThreads();
  simt::SetWorkerThreads(3);
  const int n = 50000;
  std::vector<int> values(n);
  for (int i = 0; i < n; ++i) values[i] = (i * 7919) % 64;
  std::vector<int> hist(64, 0);
  unsigned long long total = 0;
  int max_value = INT_MIN, min_value = INT_MAX;
  unsigned int umax = 0;
  float fsum = 0.0f;
  // Host memory is device memory to the emulator.
  const HistogramOut out{hist.data(), &total, &max_value, &min_value, &umax, &fsum};
  ASSERT_TRUE(CudaOk(LaunchHistogram(values.data(), n, 64, out, 40, 64, nullptr)));
  ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
  std::vector<int> want(64, 0);
  for (int v : values) ++want[v];
  EXPECT_EQ(hist, want);
  EXPECT_EQ(total, static_cast<unsigned long long>(n));
  EXPECT_EQ(max_value, 63);
  EXPECT_EQ(min_value, 0);
  EXPECT_EQ(fsum, static_cast<float>(n));
  simt::SetWorkerThreads(saved);
}
#endif

}  // namespace
}  // namespace dcf::cuda_test
