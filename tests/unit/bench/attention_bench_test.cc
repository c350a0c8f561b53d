// The attention benchmark's report (FLOP formula, visible pairs, JSON) and
// dcformer-attention-bench run on the SIMT emulator with tiny cases.
#include <string>

#include "bench/attention/attention_report.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace dcf::bench {
namespace {

const std::string kBench = std::string(DCF_BIN_DIR) + "/dcformer-attention-bench";

TEST(AttentionReportTest, VisiblePairsFollowTheWindowRule) {
  EXPECT_EQ(VisiblePairs(0, 4, 0), 1 + 2 + 3 + 4);
  EXPECT_EQ(VisiblePairs(0, 4, 2), 1 + 2 + 2 + 2);
  EXPECT_EQ(VisiblePairs(10, 1, 0), 11);  // a decode token after 10 cached positions
  EXPECT_EQ(VisiblePairs(10, 1, 4), 4);
}

TEST(AttentionReportTest, FlopsPerPair) {
  EXPECT_DOUBLE_EQ(AttentionFlops(10, 8, 64, false), 10.0 * 4 * 8 * 64);
  EXPECT_DOUBLE_EQ(AttentionFlops(10, 8, 64, true), 10.0 * (4 * 8 * 64 + 38 * 8));
}

TEST(AttentionReportTest, FinishDerivesRates) {
  AttentionReport r;
  r.n_head = 8;
  r.head_dim = 64;
  AttentionRow row;
  row.variant = "mha";
  row.ms_per_forward = 2.0;
  Finish(r, row, 1000, 500, 4e9);
  EXPECT_DOUBLE_EQ(row.tokens_per_s, 500000.0);
  EXPECT_DOUBLE_EQ(row.gflop_per_forward, 500.0 * 2048 / 1e9);
  EXPECT_DOUBLE_EQ(row.tflop_per_s, 500.0 * 2048 / 2e-3 / 1e12);
  EXPECT_DOUBLE_EQ(row.kv_gb_per_s, 2000.0);
}

TEST(AttentionBenchCliTest, EmulatorRunWritesEveryRow) {
  testing::TempDir dir;
  const auto r =
      testing::RunCommand(kBench +
                          " --backend cuda-sim --batch 2 --dim 32 --n-head 4 --seq-lens 6,13 "
                          "--windows 0,8 --warmup 1 --iters 2 --json-out " +
                          dir.File("a.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("dcmha"), std::string::npos) << r.out;
  const auto j = nlohmann::json::parse(dir.Read("a.json"));
  EXPECT_EQ(j.at("backend"), "cuda-sim");
  EXPECT_EQ(j.at("mode"), "prefill");
  EXPECT_EQ(j.at("head_dim"), 8);
  ASSERT_EQ(j.at("rows").size(), 8u);  // 2 windows x 2 variants x 2 lengths
  for (const auto& row : j.at("rows")) {
    EXPECT_GT(row.at("ms_per_forward").get<double>(), 0) << row;
    EXPECT_GT(row.at("tokens_per_s").get<double>(), 0) << row;
    EXPECT_GT(row.at("peak_memory_mb").get<double>(), 0) << row;
  }
  // Same length and window: DCMHA counts the compose FLOPs on top of MHA's.
  const auto& rows = j.at("rows");
  EXPECT_EQ(rows[0].at("variant"), "mha");
  EXPECT_EQ(rows[2].at("variant"), "dcmha");
  EXPECT_GT(rows[2].at("gflop_per_forward").get<double>(),
            rows[0].at("gflop_per_forward").get<double>());
}

TEST(AttentionBenchCliTest, DecodeModeCountsCacheBytes) {
  testing::TempDir dir;
  const auto r = testing::RunCommand(
      kBench +
      " --backend cuda-sim --mode decode --batch 3 --dim 32 --n-head 4 --seq-lens 30 "
      "--windows 0 --variants dcmha --warmup 0 --iters 1 --json-out " +
      dir.File("d.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto row = nlohmann::json::parse(dir.Read("d.json")).at("rows").at(0);
  // 3 sequences x 30 cached rows of 2*N*hd + 10N bf16 elements, plus 3 fresh f32 rows.
  const double per_key = 2 * 32 + 10 * 4;
  EXPECT_NEAR(row.at("kv_gb_per_forward").get<double>() * 1e9,
              3 * 30 * per_key * 2 + 3 * per_key * 4, 1.0);
}

TEST(AttentionBenchCliTest, BadFlagsAreRejected) {
  for (const char* flags : {"--backend cpu", "--variants mha,gqa", "--dim 30 --n-head 4",
                            "--seq-lens 0", "--dtype int8", "--mode train"}) {
    const auto r = testing::RunCommand(kBench + " " + flags);
    EXPECT_EQ(r.exit_code, 2) << flags;
    EXPECT_NE(r.err.find("dcformer-attention-bench:"), std::string::npos) << flags << r.err;
  }
}

}  // namespace
}  // namespace dcf::bench
