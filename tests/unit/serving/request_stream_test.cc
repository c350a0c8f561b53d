#include "engine/serving/request_stream.h"

#include <thread>

#include "gtest/gtest.h"

namespace dcf {
namespace {

GenerationChunk Tokens(std::initializer_list<int32_t> ids, const std::string& text) {
  GenerationChunk c;
  for (int32_t id : ids) c.tokens.push_back({id, 0, {}});
  c.text = text;
  return c;
}

TEST(RequestStreamTest, TakeMergesPendingChunksInOrder) {
  RequestStream s("r1", 1);
  GenerationChunk out;
  EXPECT_FALSE(s.TryTake(&out));
  s.Push(Tokens({1, 2}, "ab"));
  s.Push(Tokens({3}, "c"));
  GenerationChunk fin = Tokens({4}, "d");
  fin.finished = true;
  fin.finish_reason = FinishReason::kLength;
  fin.usage.generated_tokens = 4;
  s.Push(fin);
  ASSERT_TRUE(s.TryTake(&out));
  ASSERT_EQ(out.tokens.size(), 4u);
  EXPECT_EQ(out.tokens[3].token, 4);
  EXPECT_EQ(out.text, "abcd");
  EXPECT_TRUE(out.finished);
  EXPECT_EQ(out.finish_reason, FinishReason::kLength);
  EXPECT_EQ(out.usage.generated_tokens, 4);
  EXPECT_TRUE(s.done());
  EXPECT_FALSE(s.TryTake(&out));
}

TEST(RequestStreamTest, OnReadyRunsForPendingOutputAndEachPush) {
  RequestStream s("r2", 2);
  s.Push(Tokens({1}, ""));
  int calls = 0;
  s.SetOnReady([&] { ++calls; });
  EXPECT_EQ(calls, 1);  // output was already pending
  s.Push(Tokens({2}, ""));
  EXPECT_EQ(calls, 2);
}

TEST(RequestStreamTest, WaitTakeWakesOnPushFromAnotherThread) {
  RequestStream s("r3", 3);
  GenerationChunk out;
  EXPECT_FALSE(s.WaitTake(&out, absl::ZeroDuration()));
  std::thread producer([&] { s.Push(Tokens({7}, "x")); });
  ASSERT_TRUE(s.WaitTake(&out, absl::Seconds(60)));
  producer.join();
  ASSERT_EQ(out.tokens.size(), 1u);
  EXPECT_EQ(out.tokens[0].token, 7);
}

TEST(RequestStateTest, TransitionTable) {
  using S = RequestState;
  EXPECT_TRUE(IsValidTransition(S::kQueued, S::kPrefill));
  EXPECT_TRUE(IsValidTransition(S::kDecode, S::kPreempted));
  EXPECT_TRUE(IsValidTransition(S::kPreempted, S::kPrefill));
  EXPECT_TRUE(IsValidTransition(S::kQueued, S::kCancelled));
  EXPECT_FALSE(IsValidTransition(S::kQueued, S::kDecode));
  EXPECT_FALSE(IsValidTransition(S::kFinished, S::kCancelled));
  EXPECT_FALSE(IsValidTransition(S::kPreempted, S::kDecode));
  EXPECT_STREQ(FinishReasonName(FinishReason::kStopString), "stop_string");
  EXPECT_STREQ(RequestStateName(S::kPreempted), "preempted");
}

}  // namespace
}  // namespace dcf
