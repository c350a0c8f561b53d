// The emulator's checks: each violation stops the launch, becomes a sticky
// cudaErrorLaunchFailure reported by later calls, and leaves a message that names the kernel,
// block, thread, call site and offending value.
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "engine/simt/simt_testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/simt/cuda_test_util.h"
#include "tests/unit/simt/violation_kernels.h"

namespace dcf::cuda_test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class ViolationTest : public ::testing::Test {
 protected:
  void SetUp() override { simt::ClearErrors(); }
  void TearDown() override { simt::ClearErrors(); }

  // Runs the violation and checks the error is sticky; returns the message.
  std::string Run(Violation v) {
    std::vector<int> out(64, 0);
    EXPECT_EQ(LaunchViolation(v, out.data()), cudaErrorLaunchFailure);
    // Sticky: reported again, and by unrelated calls.
    EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, 16), cudaErrorLaunchFailure);
    return simt::LastErrorMessage();
  }
};

std::string At(int line) {
  return "tests/unit/simt/violation_kernels.cu:" + std::to_string(line);
}

TEST_F(ViolationTest, LineConstantsPointAtTheirCalls) {
  std::ifstream in(std::string(DCF_SOURCE_DIR) + "/tests/unit/simt/violation_kernels.cu");
  ASSERT_TRUE(in.good());
  std::vector<std::string> lines(1);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  EXPECT_THAT(lines.at(kPartialBarrierLine), HasSubstr("// kPartialBarrierLine"));
  EXPECT_THAT(lines.at(kFirstBarrierLine), HasSubstr("// kFirstBarrierLine"));
  EXPECT_THAT(lines.at(kSecondBarrierLine), HasSubstr("// kSecondBarrierLine"));
  EXPECT_THAT(lines.at(kShuffleLine), HasSubstr("// kShuffleLine"));
}

TEST_F(ViolationTest, ThreadReturningBeforeABarrier) {
  EXPECT_THAT(Run(Violation::kPartialBarrier),
              AllOf(HasSubstr("kernel 'PartialBarrierKernel' block (0,0,0) thread (3,0,0)"),
                    HasSubstr("exits while 3 thread(s) wait at __syncthreads at " +
                              At(kPartialBarrierLine))));
}

TEST_F(ViolationTest, BarriersAtDifferentCallSites) {
  EXPECT_THAT(Run(Violation::kMismatchedBarriers),
              AllOf(HasSubstr("kernel 'MismatchedBarriersKernel' block (0,0,0) thread (16,0,0)"),
                    HasSubstr("at " + At(kSecondBarrierLine)),
                    HasSubstr("thread (0,0,0) waits at a different __syncthreads at " +
                              At(kFirstBarrierLine))));
}

TEST_F(ViolationTest, SharedIndexPastTheEnd) {
  EXPECT_THAT(Run(Violation::kSharedIndexTooLarge),
              AllOf(HasSubstr("kernel 'SharedIndexKernel' block (0,0,0) thread (5,0,0)"),
                    HasSubstr("shared array 'tile': index 32 is out of bounds [0, 32)")));
}

TEST_F(ViolationTest, NegativeSharedIndex) {
  EXPECT_THAT(Run(Violation::kSharedIndexNegative),
              HasSubstr("thread (5,0,0): shared array 'tile': index -1 is out of bounds [0, 32)"));
}

TEST_F(ViolationTest, DynamicSharedIndexPastTheLaunchSize) {
  EXPECT_THAT(Run(Violation::kDynamicIndexTooLarge),
              HasSubstr("thread (64,0,0): shared array 'values': index 64 is out of bounds "
                        "[0, 64)"));
}

TEST_F(ViolationTest, StaticSharedMemoryOver48KiB) {
  EXPECT_THAT(Run(Violation::kStaticSharedTooLarge),
              HasSubstr("static shared memory of the block reaches 50176 bytes with array 'b'"));
}

TEST_F(ViolationTest, MaskNamingLanesThatDoNotExist) {
  EXPECT_THAT(Run(Violation::kMaskNamesMissingLanes),
              AllOf(HasSubstr("thread (32,0,0): __shfl_sync at " + At(kShuffleLine)),
                    HasSubstr("mask 0xffffffff names lanes that do not exist (warp 1 of this "
                              "40-thread block has lanes 0..7)")));
}

TEST_F(ViolationTest, LaneThatExitedBeforeAShuffle) {
  // Lanes 0-6 wait at the shuffle when lane 7 exits.
  EXPECT_THAT(Run(Violation::kLaneExited),
              AllOf(HasSubstr("thread (7,0,0): exits while lane 0 (thread (0,0,0)) waits for it "
                              "at __shfl_xor_sync"),
                    HasSubstr("with mask 0xffffffff")));
}

TEST_F(ViolationTest, CallerNotInItsMask) {
  EXPECT_THAT(Run(Violation::kCallerNotInMask), HasSubstr("thread (3,0,0): __shfl_sync at"));
  EXPECT_THAT(simt::LastErrorMessage(),
              HasSubstr("mask 0x00000001 does not name the calling lane 3"));
}

TEST_F(ViolationTest, ShuffleReadingALaneOutsideTheMask) {
  EXPECT_THAT(Run(Violation::kReadOutsideMask),
              HasSubstr("lane 8 (thread (8,0,0)) reads lane 16, which is not in mask 0x0000ffff"));
}

TEST_F(ViolationTest, LanesAtDifferentCollectives) {
  EXPECT_THAT(
      Run(Violation::kMismatchedCollectives),
      AllOf(HasSubstr("thread (0,0,0): __shfl_sync at"),
            HasSubstr("never completes: lane 16 (thread (16,0,0)) waits at __ballot_sync")));
}

TEST_F(ViolationTest, BarrierWhileTheWarpWaitsAtAShuffle) {
  EXPECT_THAT(Run(Violation::kBarrierWhileWarpWaits),
              HasSubstr("lane 0 (thread (0,0,0)) waits at __syncthreads"));
}

TEST_F(ViolationTest, ShuffleWidthNotAPowerOfTwo) {
  EXPECT_THAT(Run(Violation::kBadWidth), HasSubstr("width 12 is not a power of two in [1, 32]"));
}

TEST_F(ViolationTest, ClearErrorsRecovers) {
  Run(Violation::kPartialBarrier);
  simt::ClearErrors();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  std::vector<int> out(64, -1);
  ASSERT_TRUE(CudaOk(LaunchIota(out.data(), 64, 0)));
  ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
  for (int i = 0; i < 64; ++i) EXPECT_EQ(out[i], i);
  EXPECT_EQ(simt::LastErrorMessage(), "");
}

TEST_F(ViolationTest, AbortModeAbortsWithTheMessage) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  ASSERT_EQ(setenv("DCF_SIMT_ABORT", "1", 1), 0);
  std::vector<int> out(64, 0);
  EXPECT_DEATH(LaunchViolation(Violation::kSharedIndexTooLarge, out.data()),
               "aborting \\(DCF_SIMT_ABORT=1\\)");
  unsetenv("DCF_SIMT_ABORT");
}

// The racecheck (engine/simt/racecheck.h): a planted race is caught under every schedule,
// whichever thread of the pair runs first; race-free exchanges are accepted.
TEST_F(ViolationTest, RacecheckCatchesPlantedRacesUnderEverySchedule) {
  const simt::Schedule saved = simt::GetSchedule();
  for (const char* name : {"linear", "reverse", "random:7"}) {
    simt::Schedule schedule;
    ASSERT_TRUE(simt::ParseSchedule(name, &schedule));
    simt::SetSchedule(schedule);
    SCOPED_TRACE(name);
    EXPECT_THAT(Run(Violation::kRaceAcrossWarps),
                AllOf(HasSubstr("kernel 'RaceKernel' block (0,0,0)"),
                      HasSubstr("hazard on shared array 's' element"),
                      HasSubstr("with no barrier between (since the block's start)")));
    simt::ClearErrors();
    EXPECT_THAT(Run(Violation::kRaceWriteWrite),
                HasSubstr("racecheck: Write-after-Write hazard on shared array 's' element 0"));
    simt::ClearErrors();
    EXPECT_THAT(Run(Violation::kRaceDynamic),
                AllOf(HasSubstr("kernel 'DynamicRaceKernel'"),
                      HasSubstr("hazard on shared array 'd' element")));
    simt::ClearErrors();
    EXPECT_THAT(Run(Violation::kRaceInWarp),
                AllOf(HasSubstr("hazard on shared array 's' element"),
                      HasSubstr(", nor a warp collective")));
    simt::ClearErrors();
    std::vector<int> out(64, -1);
    ASSERT_EQ(LaunchRaceFree(out.data()), cudaSuccess) << simt::LastErrorMessage();
    for (int t = 0; t < 64; ++t) EXPECT_EQ(out[t], (t ^ 1) + (t + 32) % 64 + 64) << t;
  }
  simt::SetSchedule(saved);
}

// Under the linear schedule the reader of the pair runs first: thread 0 reads s[32] before
// thread 32 writes it.
TEST_F(ViolationTest, RacecheckNamesBothThreadsOfTheHazard) {
  const simt::Schedule saved = simt::GetSchedule();
  simt::SetSchedule(simt::Schedule{});
  EXPECT_THAT(Run(Violation::kRaceAcrossWarps),
              HasSubstr("thread (32,0,0): racecheck: Write-after-Read hazard on shared array 's' "
                        "element 32: thread (0,0,0) read it and thread (32,0,0) writes it"));
  simt::SetSchedule(saved);
}

TEST_F(ViolationTest, StackOverflowIsReportedByName) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<int> out(2, 0);
  EXPECT_DEATH(LaunchStackOverflow(out.data()),
               "fiber stack overflow in kernel 'StackOverflowKernel'.*DCF_SIMT_STACK_KB");
}

}  // namespace
}  // namespace dcf::cuda_test
