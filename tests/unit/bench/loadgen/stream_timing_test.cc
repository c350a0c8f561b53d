#include "bench/loadgen/stream_timing.h"

#include <numeric>

#include "gtest/gtest.h"

namespace dcf::loadgen {
namespace {

Clock::time_point At(double ms) {
  return Clock::time_point() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(ms));
}

TEST(StreamTimingTest, OneTokenPerMessage) {
  StreamTiming t(At(0));
  t.OnMessage(At(50), 1);
  t.OnMessage(At(60), 1);
  t.OnMessage(At(75), 1);
  t.OnMessage(At(76), 0);  // final message without tokens
  t.OnEnd(At(80));
  EXPECT_EQ(t.tokens(), 3);
  EXPECT_NEAR(t.ttft_ms(), 50, 1e-6);
  ASSERT_EQ(t.itl_ms().size(), 2u);
  EXPECT_NEAR(t.itl_ms()[0], 10, 1e-6);
  EXPECT_NEAR(t.itl_ms()[1], 15, 1e-6);
  EXPECT_NEAR(t.tpot_ms(), 12.5, 1e-6);
  EXPECT_NEAR(t.e2e_ms(), 80, 1e-6);
}

TEST(StreamTimingTest, CoalescedTokensShareTheirMessagesGap) {
  StreamTiming t(At(0));
  t.OnMessage(At(20), 2);  // first token + one more: one gap of 0
  t.OnMessage(At(50), 3);  // 30 ms for 3 tokens: three gaps of 10
  t.OnMessage(At(54), 1);  // 4
  t.OnMessage(At(70), 4);  // 16 ms for 4 tokens: four gaps of 4
  t.OnEnd(At(71));
  EXPECT_EQ(t.tokens(), 10);
  EXPECT_NEAR(t.ttft_ms(), 20, 1e-6);
  const std::vector<double> expected = {0, 10, 10, 10, 4, 4, 4, 4, 4};
  ASSERT_EQ(t.itl_ms().size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_NEAR(t.itl_ms()[i], expected[i], 1e-6) << i;
  // n - 1 gaps summing to last - first token: their mean is the TPOT.
  const double sum = std::accumulate(t.itl_ms().begin(), t.itl_ms().end(), 0.0);
  EXPECT_NEAR(sum, 50, 1e-6);
  EXPECT_NEAR(t.tpot_ms(), 50.0 / 9, 1e-6);
}

TEST(StreamTimingTest, NoTokens) {
  StreamTiming t(At(0));
  t.OnMessage(At(5), 0);
  t.OnEnd(At(6));
  EXPECT_EQ(t.tokens(), 0);
  EXPECT_TRUE(t.itl_ms().empty());
  EXPECT_NEAR(t.e2e_ms(), 6, 1e-6);
}

TEST(StreamTimingTest, SingleMessageWithAllTokens) {
  StreamTiming t(At(0));
  t.OnMessage(At(30), 4);
  t.OnEnd(At(31));
  EXPECT_EQ(t.itl_ms(), (std::vector<double>{0, 0, 0}));
  EXPECT_NEAR(t.tpot_ms(), 0, 1e-9);
}

}  // namespace
}  // namespace dcf::loadgen
