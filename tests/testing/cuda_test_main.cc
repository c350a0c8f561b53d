// main() of every test built by dcf_add_cuda_test. In the real CUDA build it first checks for
// a device: without one every test is skipped with a message saying why (CI machines have no
// GPU; the emulator build of the same tests runs there instead).
#include <cstdio>
#include <string>

#include "engine/simt/cuda_compat.h"
#include "gtest/gtest.h"

namespace {

// Records a skip for every test as it starts: gtest then does not run the test body, and
// prints "[  SKIPPED ]" with the reason, which CTest counts as skipped rather than passed.
class SkipEveryTest : public ::testing::EmptyTestEventListener {
 public:
  explicit SkipEveryTest(std::string reason) : reason_(std::move(reason)) {}
  void OnTestStart(const ::testing::TestInfo&) override { GTEST_SKIP() << reason_; }

 private:
  std::string reason_;
};

std::string SkipReason() {
#if defined(DCF_CUDA_SIM)
  return "";
#else
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    return std::string("no CUDA device: cudaGetDeviceCount failed with ") +
           cudaGetErrorName(error) + " (" + cudaGetErrorString(error) + ")";
  }
  if (count == 0) return "no CUDA device: cudaGetDeviceCount returned 0";
  return "";
#endif
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!::testing::GTEST_FLAG(list_tests)) {
    const std::string reason = SkipReason();
    if (!reason.empty()) {
      std::fprintf(stderr, "SKIPPING all tests: %s\n", reason.c_str());
      ::testing::UnitTest::GetInstance()->listeners().Append(new SkipEveryTest(reason));
    }
  }
  return RUN_ALL_TESTS();
}
