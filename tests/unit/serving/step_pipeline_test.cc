// StepPipeline (engine/serving/step_pipeline.h), the engine's bookkeeping of pipelined steps,
// without a model or an engine: pending tokens at launch, chaining, dropped chunks, and step
// times that never overlap.
#include "engine/serving/step_pipeline.h"

#include <array>
#include <vector>

#include "gtest/gtest.h"

namespace dcf::engine_internal {
namespace {

// StepPipeline only names requests: opaque pointers, never dereferenced.
std::array<int, 2> request_ids;
ActiveRequest* Request(int i) { return reinterpret_cast<ActiveRequest*>(&request_ids[i]); }

Sequence Decoding(int prompt_len, int generated) {
  Sequence s;
  s.tokens.assign(prompt_len + generated, 7);
  s.prompt_len = prompt_len;
  s.max_len = prompt_len + 100;
  s.kv.num_tokens = static_cast<int>(s.tokens.size()) - 1;
  return s;
}

// A step: a decode of `a` (it samples) and a prefill chunk of 5 tokens of `b` that samples
// nothing.
SchedulerOutput Plan(Sequence* a, Sequence* b) {
  SchedulerOutput out;
  out.chunks.push_back({a, static_cast<int>(a->tokens.size()) - 1, 1, true});
  out.chunks.push_back({b, 0, 5, false});
  out.num_tokens = 6;
  out.num_prefill_tokens = 5;
  return out;
}

// Each launch adds the token it samples as a pending token; the second launch is chained to
// the first, which it returns (to be completed) with its slots and token counts.
TEST(StepPipelineTest, LaunchesAddPendingTokensAndChain) {
  Sequence a = Decoding(4, 2), b = Decoding(12, 0);
  StepPipeline p;
  EXPECT_FALSE(p.has_in_flight());
  const absl::Time t = absl::UnixEpoch();
  EXPECT_FALSE(p.Launched(Plan(&a, &b), {Request(0), Request(1)}, {3, 4, 5}, t).has_value());
  EXPECT_TRUE(p.has_in_flight());
  EXPECT_EQ(a.num_pending, 1);
  EXPECT_EQ(a.tokens.size(), 7u);
  EXPECT_EQ(a.tokens.back(), kPendingToken);
  EXPECT_EQ(b.num_pending, 0);
  EXPECT_EQ(b.tokens.size(), 12u);
  EXPECT_EQ(p.chained_steps(), 0);

  b.kv.num_tokens = 5;
  SchedulerOutput second = Plan(&a, &b);
  second.chunks[1].start = 5;
  const std::optional<InFlightStep> first =
      p.Launched(second, {Request(0), Request(1)}, {0, 1, 2}, t + absl::Milliseconds(1));
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->owners, (std::vector<ActiveRequest*>{Request(0), Request(1)}));
  EXPECT_EQ(first->slots, (std::vector<int32_t>{3, -1}));
  EXPECT_EQ(first->num_tokens, (std::vector<int32_t>{1, 5}));
  EXPECT_EQ(first->num_tokens_total, 6);
  EXPECT_EQ(first->num_prefill_tokens, 5);
  EXPECT_EQ(first->start, t);
  EXPECT_EQ(a.num_pending, 2);
  EXPECT_EQ(p.chained_steps(), 1);
  EXPECT_EQ(p.in_flight()->slots, (std::vector<int32_t>{0, -1}));
}

// A request that ends with a step in flight: its chunk stays in the step (the device computes
// it) with no owner, is not committed, and its tokens count as dropped once the step is
// completed. Abandon forgets the step in flight.
TEST(StepPipelineTest, DroppedChunksAreNotCommittedAndCounted) {
  Sequence a = Decoding(4, 2), b = Decoding(12, 0);
  StepPipeline p;
  const SchedulerOutput out = Plan(&a, &b);
  p.Launched(out, {Request(0), Request(1)}, {0, 1, 2}, absl::UnixEpoch());
  p.Drop(Request(1));
  const SchedulerOutput live = p.LiveChunks(out);
  ASSERT_EQ(live.chunks.size(), 1u);
  EXPECT_EQ(live.chunks[0].seq, &a);
  EXPECT_EQ(p.dropped_tokens(), 0);  // not before its results were waited for
  std::optional<InFlightStep> step = p.Take();
  ASSERT_TRUE(step.has_value());
  EXPECT_FALSE(p.has_in_flight());
  EXPECT_EQ(step->owners, (std::vector<ActiveRequest*>{Request(0), nullptr}));
  p.Completed(*step);
  EXPECT_EQ(p.dropped_tokens(), 5);
  p.Drop(Request(0));  // nothing in flight: nothing to do
  EXPECT_FALSE(p.Take().has_value());
  p.Launched(out, {Request(0), Request(1)}, {0, 1, 2}, absl::UnixEpoch());
  p.Abandon();
  EXPECT_FALSE(p.has_in_flight());
  EXPECT_EQ(p.chained_steps(), 0);
}

// Step times (EngineObserver::OnStep): a pipelined step planned before the previous one's
// results counts from them, so the times add up to the time spent; a step planned after an
// idle gap counts from its planning.
TEST(StepPipelineTest, StepTimesNeverOverlap) {
  StepPipeline p;
  const absl::Time t = absl::UnixEpoch();
  const auto ms = [](int n) { return absl::Milliseconds(n); };
  EXPECT_EQ(p.StepTime(t, t + ms(10)), ms(10));          // alone: planning to results
  EXPECT_EQ(p.StepTime(t + ms(5), t + ms(18)), ms(8));   // planned at 5, the previous ended at 10
  EXPECT_EQ(p.StepTime(t + ms(12), t + ms(26)), ms(8));  // from 18
  EXPECT_EQ(p.StepTime(t + ms(30), t + ms(33)), ms(3));  // idle from 26 to 30: from 30
  // 10 + 8 + 8 + 3 = 29 ms of steps in 33 ms, 4 of them idle.
}

}  // namespace
}  // namespace dcf::engine_internal
