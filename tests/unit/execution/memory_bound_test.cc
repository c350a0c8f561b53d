// MemoryBoundTokens (engine/execution/memory_bound.h): the largest step size whose time stays
// within the slack of a one-token step, from made-up timing curves.
#include "engine/execution/memory_bound.h"

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"

namespace dcf {
namespace {

// A step that reads `bytes` at 1 byte/s and does `flops` per token at 1 flop/s, overlapped:
// flat until the arithmetic catches up (at bytes / flops tokens), then linear.
double Roofline(int tokens, double bytes, double flops) {
  return std::max(bytes, flops * tokens);
}

TEST(MemoryBoundTokensTest, FindsWhereTheStepStopsBeingFlat) {
  std::vector<int> asked;
  const auto curve = [&](int t) {
    asked.push_back(t);
    return Roofline(t, 100, 10);  // flat up to 10 tokens; 12.5 at slack 1.25
  };
  EXPECT_EQ(MemoryBoundTokens(curve, 512), 12);
  // 1, 2, 3, 4, 6, 8, 12, then 16 is too slow and ends the search.
  EXPECT_EQ(asked, (std::vector<int>{1, 2, 3, 4, 6, 8, 12, 16}));
}

TEST(MemoryBoundTokensTest, ComputeBoundStepsGetOneToken) {
  // Linear from the first token: two tokens cost twice one.
  EXPECT_EQ(MemoryBoundTokens([](int t) { return 1.0 * t; }, 64), 1);
  // A step that is flat everywhere gets the largest size tried up to max_tokens.
  EXPECT_EQ(MemoryBoundTokens([](int) { return 1.0; }, 40), 32);
  EXPECT_EQ(MemoryBoundTokens([](int) { return 1.0; }, 48), 48);
}

TEST(MemoryBoundTokensTest, NeverPassesMaxTokensAndHonoursTheSlack) {
  EXPECT_EQ(MemoryBoundTokens([](int t) { return Roofline(t, 100, 1); }, 5), 4);
  EXPECT_EQ(MemoryBoundTokens([](int t) { return Roofline(t, 100, 1); }, 1), 1);
  EXPECT_EQ(MemoryBoundTokens([](int t) { return Roofline(t, 100, 1); }, 0), 1);
  // At slack 2 the same curve allows twice the tokens.
  EXPECT_EQ(MemoryBoundTokens([](int t) { return Roofline(t, 100, 10); }, 512, 2.0), 16);
  EXPECT_EQ(MemoryBoundTokens([](int t) { return Roofline(t, 100, 10); }, 512, 1.0), 8);
}

}  // namespace
}  // namespace dcf
