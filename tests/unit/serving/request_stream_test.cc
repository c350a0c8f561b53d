#include "engine/serving/request_stream.h"

#include <string>
#include <thread>
#include <vector>

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

// A bounded take splits only between pushes: each push's tokens keep their text, the final
// chunk's fields come with the last take, and pending_bytes() shrinks by what was taken.
TEST(RequestStreamTest, BoundedTakeSplitsBetweenPushes) {
  RequestStream s("r4", 4);
  for (int i = 0; i < 10; ++i) s.Push(Tokens({i, 100 + i}, std::string(3, static_cast<char>('a' + i))));
  GenerationChunk fin = Tokens({10}, "k");
  fin.finished = true;
  fin.finish_reason = FinishReason::kEos;
  s.Push(fin);
  // Each push of two tokens and 3 bytes of text counts 2 * 16 + 3 = 35 bytes.
  EXPECT_EQ(s.pending_bytes(), 10u * 35 + 17);
  std::vector<int32_t> ids;
  std::string text;
  std::vector<size_t> sizes;
  GenerationChunk out;
  while (s.TryTake(&out, 100)) {
    sizes.push_back(out.tokens.size());
    for (const TokenOutput& t : out.tokens) ids.push_back(t.token);
    text += out.text;
    // The text of a take is exactly the text of its pushes.
    for (size_t i = 0; i + 1 < out.tokens.size(); i += 2) {
      if (out.tokens[i].token >= 10) continue;
      EXPECT_EQ(out.tokens[i + 1].token, 100 + out.tokens[i].token);
    }
    if (out.finished) break;
    EXPECT_EQ(out.finish_reason, FinishReason::kUnspecified);
  }
  EXPECT_TRUE(out.finished);
  EXPECT_EQ(out.finish_reason, FinishReason::kEos);
  EXPECT_TRUE(s.done());
  EXPECT_EQ(s.pending_bytes(), 0u);
  // 100 bytes hold two pushes (70); the last take has pushes 8 and 9 and the final one (87).
  EXPECT_EQ(sizes, (std::vector<size_t>{4, 4, 4, 4, 5}));
  std::vector<int32_t> want;
  for (int i = 0; i < 10; ++i) {
    want.push_back(i);
    want.push_back(100 + i);
  }
  want.push_back(10);
  EXPECT_EQ(ids, want);
  EXPECT_EQ(text, "aaabbbcccdddeeefffggghhhiiijjjk");
}

TEST(RequestStreamTest, BoundedTakeTakesAnOversizedPushWhole) {
  RequestStream s("r5", 5);
  s.Push(Tokens({1, 2, 3}, std::string(1000, 'x')));
  s.Push(Tokens({4}, "y"));
  GenerationChunk out;
  ASSERT_TRUE(s.TryTake(&out, 10));
  EXPECT_EQ(out.tokens.size(), 3u);
  EXPECT_EQ(out.text.size(), 1000u);
  EXPECT_EQ(s.pending_bytes(), 17u);
  ASSERT_TRUE(s.TryTake(&out, 10));
  EXPECT_EQ(out.text, "y");
  EXPECT_FALSE(s.TryTake(&out, 10));
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
  EXPECT_TRUE(IsValidTransition(S::kPreempted, S::kFinished));  // pipelined steps
  EXPECT_TRUE(IsValidTransition(S::kQueued, S::kCancelled));
  EXPECT_FALSE(IsValidTransition(S::kQueued, S::kDecode));
  EXPECT_FALSE(IsValidTransition(S::kFinished, S::kCancelled));
  EXPECT_FALSE(IsValidTransition(S::kPreempted, S::kDecode));
  EXPECT_STREQ(FinishReasonName(FinishReason::kStopString), "stop_string");
  EXPECT_STREQ(RequestStateName(S::kPreempted), "preempted");
}

}  // namespace
}  // namespace dcf
