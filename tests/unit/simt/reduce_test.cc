#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/simt/cuda_test_util.h"
#include "tests/unit/simt/test_kernels.h"

namespace dcf::cuda_test {
namespace {

class BlockSumTest : public ::testing::TestWithParam<int> {};

TEST_P(BlockSumTest, MatchesHostSum) {
  const int threads = GetParam();
  const int blocks = 7;
  const int chunk = 3 * threads + 5;  // uneven: some threads take one element more
  std::mt19937 rng(threads);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> in(static_cast<size_t>(blocks) * chunk);
  for (float& v : in) v = dist(rng);
  DeviceBuffer<float> d_in(in);
  DeviceBuffer<float> d_out(blocks);
  ASSERT_TRUE(CudaOk(LaunchBlockSum(d_in.get(), d_out.get(), chunk, blocks, threads, nullptr)));
  ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
  const std::vector<float> out = d_out.ToHost();
  for (int b = 0; b < blocks; ++b) {
    double want = 0.0;
    for (int i = 0; i < chunk; ++i) want += in[static_cast<size_t>(b) * chunk + i];
    EXPECT_NEAR(out[b], want, 1e-4) << "block " << b;
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, BlockSumTest, ::testing::Values(32, 64, 256, 1024));

TEST(BlockSumTest, RunsOnANamedStream) {
  cudaStream_t stream = nullptr;
  ASSERT_TRUE(CudaOk(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)));
  std::vector<float> in(256, 0.5f);
  DeviceBuffer<float> d_in(in);
  DeviceBuffer<float> d_out(1);
  EXPECT_TRUE(CudaOk(LaunchBlockSum(d_in.get(), d_out.get(), 256, 1, 128, stream)));
  EXPECT_TRUE(CudaOk(cudaStreamSynchronize(stream)));
  EXPECT_EQ(d_out.ToHost()[0], 128.0f);
  EXPECT_TRUE(CudaOk(cudaStreamDestroy(stream)));
}

}  // namespace
}  // namespace dcf::cuda_test
