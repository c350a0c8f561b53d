// Both builds of one CUDA library, plus the emulator and the static CUDA runtime, link into
// one binary without clashing symbols, and each runs its own way.
#include "gtest/gtest.h"
#include "tests/unit/simt/dual_build/probe.h"

namespace dcf::cuda_test {
namespace {

TEST(DualLinkTest, EmulatorBuildRuns) {
  int result = 0;
  ASSERT_EQ(sim::SquareOnDevice(7, &result), 0);
  EXPECT_EQ(result, 49);
}

TEST(DualLinkTest, RealBuildRunsOrReportsNoDevice) {
  int result = 0;
  const int error = gpu::SquareOnDevice(9, &result);
  if (error != 0) GTEST_SKIP() << "no usable CUDA device here (cudaError_t " << error << ")";
  EXPECT_EQ(result, 81);
}

}  // namespace
}  // namespace dcf::cuda_test
