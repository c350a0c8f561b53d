#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/simt/cuda_test_util.h"
#include "tests/unit/simt/test_kernels.h"

namespace dcf::cuda_test {
namespace {

void CheckReverse(int blocks, int threads, size_t dynamic_bytes, bool opt_in) {
  const int n = blocks * threads;
  std::vector<float> in(n);
  for (int i = 0; i < n; ++i) in[i] = 0.5f * i - 3.0f;
  DeviceBuffer<float> d_in(in);
  DeviceBuffer<float> d_out(n);
  DeviceBuffer<int> d_src(n);
  ASSERT_TRUE(CudaOk(LaunchReverseDynamic(d_in.get(), d_out.get(), d_src.get(), blocks, threads,
                                          dynamic_bytes, opt_in, nullptr)));
  ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
  const std::vector<float> out = d_out.ToHost();
  const std::vector<int> src = d_src.ToHost();
  for (int b = 0; b < blocks; ++b) {
    for (int t = 0; t < threads; ++t) {
      const int i = b * threads + t;
      const int want = b * threads + (threads - 1 - t);
      ASSERT_EQ(src[i], want) << "block " << b << " thread " << t;
      ASSERT_EQ(out[i], in[want]) << "block " << b << " thread " << t;
    }
  }
}

TEST(DynamicSharedTest, TwoViewsOfOneAreaWithinTheDefaultLimit) {
  CheckReverse(/*blocks=*/5, /*threads=*/96, /*dynamic_bytes=*/96 * 8, /*opt_in=*/false);
}

TEST(DynamicSharedTest, MoreThan48KiBAfterOptIn) {
  // 1024 threads use 8 KiB; ask for 64 KiB so the launch needs the raised limit.
  CheckReverse(/*blocks=*/2, /*threads=*/1024, /*dynamic_bytes=*/64 * 1024, /*opt_in=*/true);
}

}  // namespace
}  // namespace dcf::cuda_test
