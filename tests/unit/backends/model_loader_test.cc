// Models loaded end to end through the backend factory: alternative layouts and dtypes give
// the same logits, and a config that does not fit the files is refused naming the tensor.
#include <algorithm>
#include <cmath>
#include <fstream>

#include "engine/backends/backend_factory.h"
#include "engine/serving/sequence_runner.h"
#include "gtest/gtest.h"
#include "tests/testing/model_files.h"
#include "tests/testing/temp_dir.h"

namespace dcf {
namespace {

class ModelLoaderTest : public testing::ModelFilesTest {
 protected:
  // Logits of a fixed sequence; empty (and a test failure) when the model does not load.
  std::vector<float> Logits() {
    auto m = LoadModel(dir_.path());
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return {};
    auto r = SequenceRunner::Create(m->backend.get());
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    std::vector<float> logits;
    const std::vector<int32_t> tokens = {1, 5, 9, 2, 33, 63, 0, 7, 7, 12};
    EXPECT_TRUE((*r)->Append(tokens, 4, &logits).ok());
    return logits;
  }
};

TEST_F(ModelLoaderTest, SplitQkvEqualsFused) {
  const std::vector<float> reference = Logits();
  ASSERT_EQ(reference.size(), 10u * 64);
  SplitQkv();
  Rewrite();
  EXPECT_EQ(Logits(), reference);
}

TEST_F(ModelLoaderTest, Bf16AndF16FilesLoad) {
  const std::vector<float> reference = Logits();
  ASSERT_EQ(reference.size(), 10u * 64);
  for (DType dt : {DType::kBF16, DType::kF16}) {
    Rewrite(dt);
    const std::vector<float> got = Logits();
    ASSERT_EQ(got.size(), reference.size());
    double max_diff = 0;
    for (size_t i = 0; i < got.size(); ++i) max_diff = std::max<double>(max_diff, std::abs(got[i] - reference[i]));
    EXPECT_GT(max_diff, 0.0);   // the weights were really rounded
    EXPECT_LT(max_diff, 0.5);   // ... but still the same model
  }
}

TEST_F(ModelLoaderTest, WrongConfigForFileNamesTheTensor) {
  config_json_["intermediate_size"] = 50;
  std::ofstream(dir_.File("config.json")) << config_json_.dump();
  auto m = LoadModel(dir_.path());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(std::string(m.status().message()).find("feed_forward.w1.weight"), std::string::npos)
      << m.status();
}

TEST_F(ModelLoaderTest, ReportsMissingPieces) {
  testing::TempDir dir;
  EXPECT_EQ(LoadModel(dir.path()).status().code(), absl::StatusCode::kNotFound);  // no config
  std::ofstream(dir.File("config.json")) << SmallDcFormerConfig(32, 2, 4, 48, 64, 64, 8).dump();
  auto m = LoadModel(dir.path());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);  // no weights
}

}  // namespace
}  // namespace dcf
