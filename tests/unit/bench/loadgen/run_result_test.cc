#include "bench/loadgen/run_result.h"

#include "gtest/gtest.h"

namespace dcf::loadgen {
namespace {

RequestRecord Ok(double start_ms, double end_ms, int prompt, int output) {
  RequestRecord r;
  r.start_ms = start_ms;
  r.end_ms = end_ms;
  r.prompt_tokens = prompt;
  r.output_tokens = output;
  r.requested_output_tokens = output;
  r.finish_reason = "LENGTH";
  r.ttft_ms = 10;
  r.tpot_ms = 2;
  r.e2e_ms = end_ms - start_ms;
  r.itl_ms.assign(output - 1, 2.0);
  return r;
}

RequestRecord Failed(double start_ms, double end_ms, const std::string& code) {
  RequestRecord r;
  r.start_ms = start_ms;
  r.end_ms = end_ms;
  r.code = code;
  r.error_message = code + " message";
  r.requested_output_tokens = 8;
  return r;
}

TEST(AggregateTest, CountsOnlyMeasuredRequestsAndErrorsByCode) {
  LoadSpec load;
  load.mode = LoadSpec::Mode::kClosed;
  load.concurrency = 2;
  RequestRecord warm = Ok(0, 5000, 100, 50);  // would dominate every figure if counted
  warm.warmup = true;
  const std::vector<RequestRecord> records = {
      warm,
      Ok(1000, 1500, 10, 8),
      Ok(1200, 2000, 20, 8),
      Failed(1300, 1301, "OUT_OF_RANGE"),
      Failed(1400, 1401, "OUT_OF_RANGE"),
      Failed(1500, 1502, "UNAUTHENTICATED"),
      Ok(1600, 3000, 30, 4),
  };
  const RunResult r = Aggregate(load, records, 0, false);
  EXPECT_EQ(r.warmup_requests, 1);
  EXPECT_EQ(r.requests, 6);
  EXPECT_EQ(r.ok, 3);
  EXPECT_EQ(r.failed, 3);
  EXPECT_EQ(r.errors,
            (std::map<std::string, int64_t>{{"OUT_OF_RANGE", 2}, {"UNAUTHENTICATED", 1}}));
  EXPECT_EQ(r.error_examples.at("OUT_OF_RANGE"), "OUT_OF_RANGE message");
  EXPECT_EQ(r.finish_reasons, (std::map<std::string, int64_t>{{"LENGTH", 3}}));
  // Window: first measured start (1000 ms) to last measured end (3000 ms).
  EXPECT_DOUBLE_EQ(r.duration_s, 2.0);
  EXPECT_EQ(r.input_tokens, 60);
  EXPECT_EQ(r.output_tokens, 20);
  EXPECT_EQ(r.requested_output_tokens, 20);
  EXPECT_DOUBLE_EQ(r.requests_per_s, 1.5);
  EXPECT_DOUBLE_EQ(r.output_tokens_per_s, 10);
  EXPECT_DOUBLE_EQ(r.input_tokens_per_s, 30);
  EXPECT_EQ(r.ttft_ms.count, 3);
  EXPECT_EQ(r.tpot_ms.count, 3);
  EXPECT_EQ(r.e2e_ms.count, 3);
  EXPECT_EQ(r.itl_ms.count, 7 + 7 + 3);
  EXPECT_DOUBLE_EQ(r.e2e_ms.max, 1400);
  EXPECT_EQ(r.sent_per_s, 0);  // closed loop: not reported
}

TEST(AggregateTest, OpenLoopAchievedSendRate) {
  LoadSpec load;
  load.mode = LoadSpec::Mode::kOpen;
  load.rate = 4;
  std::vector<RequestRecord> records;
  for (int i = 0; i < 5; ++i) records.push_back(Ok(250.0 * i, 250.0 * i + 100, 1, 2));
  const RunResult r = Aggregate(load, records, 1.5, false);
  EXPECT_DOUBLE_EQ(r.sent_per_s, 4.0);  // 4 gaps over 1 s
  EXPECT_DOUBLE_EQ(r.max_send_lag_ms, 1.5);
  EXPECT_EQ(load.Label(), "4/s");
}

TEST(AggregateTest, SumsDraftsOfOkRequestsIntoAnAcceptanceRate) {
  std::vector<RequestRecord> records;
  for (int i = 0; i < 4; ++i) {
    RequestRecord r = Ok(100.0 * i, 100.0 * i + 50, 100, 8);
    r.draft_tokens = 10 * (i + 1);    // 10, 20, 30, 40
    r.accepted_draft_tokens = i + 1;  // 1, 2, 3, 4
    if (i == 3) r.code = "UNAVAILABLE";  // failed: not counted
    records.push_back(r);
  }
  const RunResult r = Aggregate(LoadSpec{}, records, 0, false);
  EXPECT_EQ(r.draft_tokens, 60);
  EXPECT_EQ(r.accepted_draft_tokens, 6);
  EXPECT_DOUBLE_EQ(r.acceptance_rate, 0.1);
  const RunResult none = Aggregate(LoadSpec{}, {Ok(0, 10, 100, 4)}, 0, false);
  EXPECT_EQ(none.draft_tokens, 0);
  EXPECT_DOUBLE_EQ(none.acceptance_rate, 0);
}

TEST(AggregateTest, SplitsTtftByPrefixHitAndTurn) {
  std::vector<RequestRecord> records;
  for (int i = 0; i < 6; ++i) {
    RequestRecord r = Ok(100.0 * i, 100.0 * i + 50, 100, 4);
    r.ttft_ms = i < 2 ? 40 + i : 4 + i;  // two misses, four hits
    r.cached_tokens = i < 2 ? 0 : 96;
    r.turn = 1 + i % 3;
    records.push_back(r);
  }
  const RunResult r = Aggregate(LoadSpec{}, records, 0, false);
  EXPECT_EQ(r.cached_tokens, 4 * 96);
  EXPECT_EQ(r.ttft_miss_ms.count, 2);
  EXPECT_DOUBLE_EQ(r.ttft_miss_ms.p50, 40.5);
  EXPECT_EQ(r.ttft_hit_ms.count, 4);
  EXPECT_DOUBLE_EQ(r.ttft_hit_ms.max, 9);
  ASSERT_EQ(r.ttft_ms_by_turn.size(), 3u);
  EXPECT_EQ(r.ttft_ms_by_turn.at(1).count, 2);  // requests 0 and 3
  EXPECT_DOUBLE_EQ(r.ttft_ms_by_turn.at(1).min, 7);
  EXPECT_DOUBLE_EQ(r.ttft_ms_by_turn.at(1).max, 40);
}

TEST(AggregateTest, NothingMeasured) {
  const RunResult r = Aggregate(LoadSpec{}, {}, 0, true);
  EXPECT_EQ(r.requests, 0);
  EXPECT_EQ(r.requests_per_s, 0);
  EXPECT_TRUE(r.interrupted);
}

}  // namespace
}  // namespace dcf::loadgen
