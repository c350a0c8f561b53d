#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/simt/cuda_test_util.h"
#include "tests/unit/simt/test_kernels.h"

namespace dcf::cuda_test {
namespace {

void CheckIndices(dim3 grid, dim3 block) {
  const int threads = block.x * block.y * block.z;
  const int blocks = grid.x * grid.y * grid.z;
  DeviceBuffer<int> out(std::vector<int>(static_cast<size_t>(threads) * blocks * 12, -1));
  ASSERT_TRUE(CudaOk(LaunchWriteIndices(out.get(), grid, block, nullptr)));
  const std::vector<int> got = out.ToHost();
  size_t i = 0;
  for (unsigned bz = 0; bz < grid.z; ++bz) {
    for (unsigned by = 0; by < grid.y; ++by) {
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        for (unsigned tz = 0; tz < block.z; ++tz) {
          for (unsigned ty = 0; ty < block.y; ++ty) {
            for (unsigned tx = 0; tx < block.x; ++tx, i += 12) {
              const std::vector<int> want = {int(tx),      int(ty),     int(tz),      int(bx),
                                             int(by),      int(bz),     int(block.x), int(block.y),
                                             int(block.z), int(grid.x), int(grid.y),  int(grid.z)};
              const std::vector<int> have(got.begin() + i, got.begin() + i + 12);
              ASSERT_EQ(have, want) << "block (" << bx << "," << by << "," << bz << ") thread ("
                                    << tx << "," << ty << "," << tz << ")";
            }
          }
        }
      }
    }
  }
}

TEST(IndexingTest, ThreeDimensionalGridAndBlock) { CheckIndices(dim3(3, 2, 2), dim3(4, 3, 2)); }

TEST(IndexingTest, BlockThatIsNotAMultipleOfAWarp) { CheckIndices(dim3(2, 1, 3), dim3(5, 5, 4)); }

TEST(IndexingTest, IntegerLaunchDimensionsMeanX) { CheckIndices(dim3(4), dim3(33)); }

}  // namespace
}  // namespace dcf::cuda_test
