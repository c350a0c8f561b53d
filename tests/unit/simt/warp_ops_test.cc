// Warp shuffles and votes against a host model written from the CUDA Programming Guide's
// description (independently of the emulator's PTX-based formula).
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/simt/cuda_test_util.h"
#include "tests/unit/simt/test_kernels.h"

namespace dcf::cuda_test {
namespace {

// The lane whose value a shuffle returns, per the Programming Guide.
int GuideSource(WarpOpKind op, int lane, int arg, int width) {
  const int segment = lane / width * width;
  const int in_segment = lane - segment;
  switch (op) {
    case WarpOpKind::kIdx:
      return segment + (arg & (width - 1));  // srcLane modulo width, within the segment
    case WarpOpKind::kUp:
      return in_segment < arg ? lane : lane - arg;  // the lowest `delta` lanes keep theirs
    case WarpOpKind::kDown:
      return in_segment + arg >= width ? lane : lane + arg;
    case WarpOpKind::kXor: {
      const int source = lane ^ arg;
      return source >= segment + width ? lane : source;  // later groups: own value
    }
    default:
      return lane;
  }
}

const char* Name(WarpOpKind op) {
  switch (op) {
    case WarpOpKind::kIdx:
      return "shfl";
    case WarpOpKind::kUp:
      return "shfl_up";
    case WarpOpKind::kDown:
      return "shfl_down";
    case WarpOpKind::kXor:
      return "shfl_xor";
    case WarpOpKind::kBallot:
      return "ballot";
    case WarpOpKind::kAny:
      return "any";
    case WarpOpKind::kAll:
      return "all";
    case WarpOpKind::kSyncWarp:
      return "syncwarp";
  }
  return "?";
}

template <typename T>
std::vector<T> LaneValues(int threads) {
  std::vector<T> v(threads);
  for (int t = 0; t < threads; ++t) {
    if constexpr (sizeof(T) == 8 && std::is_integral_v<T>) {
      v[t] = static_cast<T>((static_cast<uint64_t>(t + 1) << 35) + 3 * t + 1);  // uses 64 bits
    } else if constexpr (std::is_floating_point_v<T>) {
      v[t] = static_cast<T>(t) * static_cast<T>(0.5) + static_cast<T>(0.25);
    } else {
      v[t] = static_cast<T>(3 * t + 1);
    }
  }
  return v;
}

template <typename T>
class ShuffleTest : public ::testing::Test {};
using ShuffleTypes =
    ::testing::Types<int, unsigned int, long long, unsigned long long, float, double>;
TYPED_TEST_SUITE(ShuffleTest, ShuffleTypes);

// A 64-thread block (two full warps) and a 48-thread block (a second warp of 16 lanes that
// uses mask 0xffff; widths up to 16 keep every source inside the mask).
TYPED_TEST(ShuffleTest, MatchesTheProgrammingGuide) {
  using T = TypeParam;
  struct Config {
    int threads;
    std::vector<int> widths;
  };
  const Config configs[] = {{64, {32, 16, 8, 1}}, {48, {16, 4}}};
  const std::vector<std::pair<WarpOpKind, std::vector<int>>> ops = {
      {WarpOpKind::kIdx, {0, 5, 31, 37}},
      {WarpOpKind::kUp, {0, 1, 3, 16}},
      {WarpOpKind::kDown, {0, 1, 3, 16}},
      {WarpOpKind::kXor, {1, 2, 16, 31}},
  };
  for (const Config& config : configs) {
    const std::vector<T> values = LaneValues<T>(config.threads);
    DeviceBuffer<T> d_values(values);
    DeviceBuffer<T> d_out(config.threads);
    for (int width : config.widths) {
      for (const auto& [op, args] : ops) {
        for (int arg : args) {
          const std::string where = std::string(Name(op)) + " arg " + std::to_string(arg) +
                                    " width " + std::to_string(width) + " threads " +
                                    std::to_string(config.threads);
          ASSERT_TRUE(CudaOk(LaunchWarpOp<T>(op, d_values.get(), d_out.get(), arg, width,
                                             config.threads, nullptr)))
              << where;
          const std::vector<T> out = d_out.ToHost();
          for (int t = 0; t < config.threads; ++t) {
            const int base = t / 32 * 32;
            const int source = base + GuideSource(op, t - base, arg, width);
            ASSERT_EQ(out[t], values[source]) << where << " thread " << t;
          }
        }
      }
    }
  }
}

template <typename T>
class VoteTest : public ::testing::Test {};
using VoteTypes = ::testing::Types<int, unsigned int, long long>;
TYPED_TEST_SUITE(VoteTest, VoteTypes);

TYPED_TEST(VoteTest, BallotAnyAllMatchHost) {
  using T = TypeParam;
  std::mt19937 rng(11);
  for (int threads : {64, 48}) {
    for (int pattern = 0; pattern < 5; ++pattern) {
      std::vector<T> predicates(threads);
      for (int t = 0; t < threads; ++t) {
        switch (pattern) {
          case 0:
            predicates[t] = 0;
            break;
          case 1:
            predicates[t] = 7;
            break;
          case 2:
            predicates[t] = t % 2;
            break;
          case 3:
            predicates[t] = t == 37 ? 1 : 0;
            break;
          default:
            predicates[t] = static_cast<T>(rng() % 2);
            break;
        }
      }
      DeviceBuffer<T> d_pred(predicates);
      DeviceBuffer<T> d_out(threads);
      for (WarpOpKind op :
           {WarpOpKind::kBallot, WarpOpKind::kAny, WarpOpKind::kAll, WarpOpKind::kSyncWarp}) {
        ASSERT_TRUE(
            CudaOk(LaunchWarpOp<T>(op, d_pred.get(), d_out.get(), 0, 32, threads, nullptr)));
        const std::vector<T> out = d_out.ToHost();
        for (int t = 0; t < threads; ++t) {
          const int base = t / 32 * 32;
          const int lanes = std::min(threads - base, 32);
          const uint32_t mask = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1u;
          uint32_t ballot = 0;
          for (int l = 0; l < lanes; ++l) {
            if (predicates[base + l] != 0) ballot |= 1u << l;
          }
          T want = predicates[t];
          if (op == WarpOpKind::kBallot) want = static_cast<T>(ballot);
          if (op == WarpOpKind::kAny) want = ballot != 0;
          if (op == WarpOpKind::kAll) want = ballot == mask;
          ASSERT_EQ(out[t], want) << Name(op) << " pattern " << pattern << " threads " << threads
                                  << " thread " << t;
        }
      }
    }
  }
}

}  // namespace
}  // namespace dcf::cuda_test
