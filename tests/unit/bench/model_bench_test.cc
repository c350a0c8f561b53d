// dcformer-model-bench on the CPU backend with a golden checkpoint: the decode and serving
// measurements it reports (numbers are not asserted, only their presence and consistency).
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/golden.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace dcf {
namespace {

const std::string kBench = std::string(DCF_BIN_DIR) + "/dcformer-model-bench";

TEST(ModelBenchCliTest, DecodeAndServeOnTheCpu) {
  testing::TempDir dir;
  const auto r = testing::RunCommand(
      kBench + " --model " + testing::GoldenDir("dcformer-f32-long-prompt") +
      " --backend cpu --decode-batches 1,2 --context 20 --decode-steps 2 --serve-requests 2 "
      "--serve-prompt 6 --serve-new 3 --json-out " +
      dir.File("m.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(dir.Read("m.json"));
  EXPECT_EQ(j.at("backend"), "cpu");
  EXPECT_EQ(j.at("compose"), true);
  // Read per step: 4 layers of (4 E^2 + 3 E F + E C K + C K 2I N + E C N) and the output
  // head V E, E 128, F 512, N 8, K 32, V 300, in f32 (not the embedding table).
  EXPECT_EQ(
      j.at("weight_bytes").get<double>(),
      4.0 * (4 * (4 * 128 * 128 + 3 * 128 * 512 + 128 * 4 * 32 + 4 * 32 * 4 * 8 + 128 * 4 * 8) +
             300 * 128));
  ASSERT_EQ(j.at("decode").size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const auto& d = j.at("decode")[i];
    EXPECT_EQ(d.at("batch"), i + 1);
    EXPECT_GT(d.at("tokens_per_s").get<double>(), 0);
    // Each of the batch's queries reads its 21+ cached rows of every layer.
    EXPECT_GT(d.at("kv_bytes_per_step").get<double>(), 0);
    EXPECT_NEAR(d.at("bytes_per_step").get<double>(),
                j.at("weight_bytes").get<double>() + d.at("kv_bytes_per_step").get<double>(), 1);
  }
  EXPECT_GT(j.at("decode")[1].at("kv_bytes_per_step").get<double>(),
            j.at("decode")[0].at("kv_bytes_per_step").get<double>());
  EXPECT_EQ(j.at("serve").at("output_tokens"), 6);
  EXPECT_GT(j.at("serve").at("steps").get<int>(), 2);

  const auto mha = testing::RunCommand(
      kBench + " --model " + testing::GoldenDir("dcformer-f32-long-prompt") +
      " --backend cpu --nocompose --decode-batches 1 --context 8 --decode-steps 1");
  ASSERT_EQ(mha.exit_code, 0) << mha.err;
  EXPECT_NE(mha.out.find("compose off"), std::string::npos) << mha.out;
}

TEST(ModelBenchCliTest, BadArguments) {
  auto r = testing::RunCommand(kBench + " --backend cpu");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--model"), std::string::npos) << r.err;
  r = testing::RunCommand(kBench + " --model " + testing::GoldenDir("dcformer-f32-long-prompt") +
                          " --backend cpu --decode-batches 0");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  r = testing::RunCommand(kBench + " --model " + testing::GoldenDir("dcformer-f32-long-prompt") +
                          " --backend cpu --decode-batches 1 --context 5000");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("exceeds the model context"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace dcf
