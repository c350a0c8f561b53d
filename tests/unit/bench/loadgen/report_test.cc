// The report pieces: JSON fields, the progress line, the gnuplot script.
#include "bench/loadgen/report.h"

#include <sstream>

#include "bench/loadgen/latency_plot.h"
#include "bench/loadgen/progress_line.h"
#include "gtest/gtest.h"

namespace dcf::loadgen {
namespace {

RunResult SomeRun(LoadSpec::Mode mode) {
  RunResult r;
  r.load.mode = mode;
  r.load.concurrency = 8;
  r.load.rate = 2.5;
  r.requests = 10;
  r.ok = 9;
  r.failed = 1;
  r.errors["OUT_OF_RANGE"] = 1;
  r.error_examples["OUT_OF_RANGE"] = "too long";
  r.finish_reasons["LENGTH"] = 9;
  r.output_tokens_per_s = 123;
  r.ttft_ms = Summarize({1, 2, 3});
  r.itl_ms = Summarize({4, 5});
  r.e2e_ms = Summarize({10, 20});
  return r;
}

TEST(ReportTest, RunJsonHasTheDocumentedFields) {
  const nlohmann::ordered_json closed = RunToJson(SomeRun(LoadSpec::Mode::kClosed));
  EXPECT_EQ(closed["mode"], "closed");
  EXPECT_EQ(closed["concurrency"], 8);
  EXPECT_TRUE(closed["rate"].is_null());
  EXPECT_TRUE(closed["sent_per_s"].is_null());
  for (const char* key :
       {"label", "interrupted", "duration_s", "requests", "errors", "error_examples",
        "finish_reasons", "tokens", "throughput", "max_send_lag_ms", "latency_ms"}) {
    EXPECT_TRUE(closed.contains(key)) << key;
  }
  EXPECT_EQ(closed["requests"]["failed"], 1);
  EXPECT_EQ(closed["errors"]["OUT_OF_RANGE"], 1);
  for (const char* metric : {"ttft", "itl", "tpot", "e2e"}) {
    for (const char* stat : {"count", "mean", "min", "p50", "p90", "p99", "max"}) {
      EXPECT_TRUE(closed["latency_ms"][metric].contains(stat)) << metric << "." << stat;
    }
  }
  EXPECT_EQ(closed["latency_ms"]["ttft"]["p50"], 2.0);
  EXPECT_TRUE(closed["latency_ms"].contains("ttft_prefix_hit"));
  EXPECT_TRUE(closed["latency_ms"].contains("ttft_prefix_miss"));
  EXPECT_TRUE(closed["tokens"].contains("cached"));
  EXPECT_TRUE(closed["ttft_ms_by_turn"].is_null());
  const nlohmann::ordered_json open = RunToJson(SomeRun(LoadSpec::Mode::kOpen));
  EXPECT_EQ(open["mode"], "open");
  EXPECT_EQ(open["rate"], 2.5);
  EXPECT_TRUE(open["concurrency"].is_null());
  EXPECT_EQ(open["label"], "2.5/s");
}

TEST(ReportTest, TableShowsCountsAndErrors) {
  std::ostringstream out;
  PrintRun(out, SomeRun(LoadSpec::Mode::kClosed));
  EXPECT_NE(out.str().find("closed loop, concurrency 8: 10 requests"), std::string::npos)
      << out.str();
  EXPECT_NE(out.str().find("errors: OUT_OF_RANGE 1"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("OUT_OF_RANGE e.g.: too long"), std::string::npos) << out.str();
}

TEST(ReportTest, CountsAreSingularForOne) {
  EXPECT_EQ(CountOf(0, "request"), "0 requests");
  EXPECT_EQ(CountOf(1, "request"), "1 request");
  EXPECT_EQ(CountOf(2, "prompt"), "2 prompts");
  RunResult one = SomeRun(LoadSpec::Mode::kClosed);
  one.requests = 1;
  std::ostringstream out;
  PrintRun(out, one);
  EXPECT_NE(out.str().find("closed loop, concurrency 8: 1 request ("), std::string::npos)
      << out.str();
}

TEST(ReportTest, PrefixHitsAndTurnsGetTheirOwnRows) {
  RunResult run = SomeRun(LoadSpec::Mode::kClosed);
  run.input_tokens = 1000;
  run.cached_tokens = 250;
  run.ttft_hit_ms = Summarize({1, 1});
  run.ttft_miss_ms = Summarize({30});
  run.ttft_ms_by_turn[1] = Summarize({30});
  run.ttft_ms_by_turn[2] = Summarize({1, 1});
  std::ostringstream out;
  PrintRun(out, run);
  for (const char* needle : {"\n    hit ", "\n    miss ", "\n    t1 ", "\n    t2 ",
                             "1000 input (250 prefix-cached, 25.0%)"}) {
    EXPECT_NE(out.str().find(needle), std::string::npos) << needle << " in\n" << out.str();
  }
  const nlohmann::ordered_json j = RunToJson(run);
  EXPECT_EQ(j["tokens"]["cached"], 250);
  EXPECT_EQ(j["latency_ms"]["ttft_prefix_miss"]["p50"], 30.0);
  EXPECT_EQ(j["ttft_ms_by_turn"]["2"]["count"], 2);
}

TEST(ReportTest, SpeculationGetsALineOnlyWhenSomethingWasDrafted) {
  RunResult run = SomeRun(LoadSpec::Mode::kClosed);
  std::ostringstream plain;
  PrintRun(plain, run);
  EXPECT_EQ(plain.str().find("speculation"), std::string::npos) << plain.str();
  run.draft_tokens = 400;
  run.accepted_draft_tokens = 300;
  run.acceptance_rate = 0.75;
  std::ostringstream out;
  PrintRun(out, run);
  EXPECT_NE(out.str().find("speculation: 400 drafted, 300 accepted (acceptance rate 75.0%)"),
            std::string::npos)
      << out.str();
  const nlohmann::ordered_json j = RunToJson(run);
  EXPECT_EQ(j["tokens"]["draft"], 400);
  EXPECT_EQ(j["tokens"]["accepted_draft"], 300);
  EXPECT_EQ(j["acceptance_rate"], 0.75);
}

TEST(ReportTest, ProgressLineFillsWithFinishedRequestsOrTime) {
  RunProgress p;
  p.total = 100;
  p.finished = 50;
  p.in_flight = 8;
  p.failed = 2;
  p.elapsed_s = 2;
  p.output_tokens = 1000;
  EXPECT_EQ(ProgressLine("c=8", p, 10),
            "c=8 [#####.....] 50/100 done, 8 in flight, 2 failed, 2.0 s, 500 tok/s");
  p.total = 0;
  p.duration_s = 8;
  EXPECT_EQ(ProgressLine("2/s", p, 8),
            "2/s [##......] 50 done, 8 in flight, 2 failed, 2.0 s, 500 tok/s");
  EXPECT_EQ(ProgressLine("x", p, 4).find('\n'), std::string::npos);
}

TEST(PlotTest, ScriptHasOnePointPerRunWithOkRequests) {
  RunResult a = SomeRun(LoadSpec::Mode::kOpen);
  RunResult b = SomeRun(LoadSpec::Mode::kOpen);
  b.load.rate = 5;
  RunResult failed_only = SomeRun(LoadSpec::Mode::kOpen);
  failed_only.ok = 0;
  absl::StatusOr<std::string> s = LatencyPlotScript("/tmp/o'k.png", "t", {a, b, failed_only});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_NE(s->find("set output '/tmp/o''k.png'"), std::string::npos) << *s;
  EXPECT_NE(s->find("\"2.5/s\"\n"), std::string::npos) << *s;
  EXPECT_NE(s->find("\"5/s\"\n"), std::string::npos) << *s;
  EXPECT_NE(s->find("123 2 "), std::string::npos) << *s;  // tokens/s, TTFT p50
  EXPECT_FALSE(LatencyPlotScript("x.png", "t", {failed_only}).ok());
}

}  // namespace
}  // namespace dcf::loadgen
