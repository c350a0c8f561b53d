// WriteRandomModel's fast initialisation (RandomInit::kFastUniform, dcformer-make-model
// --init fast): deterministic per seed, uniform with the normal initialisation's spread.
#include "engine/model/random_model.h"

#include <cmath>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"
#include "engine/weights/checkpoint.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace dcf {
namespace {

ModelWeights Load(const std::string& dir, const nlohmann::json& config) {
  auto parsed = ModelConfig::FromJson(config.dump());
  EXPECT_TRUE(parsed.ok());
  auto reader = OpenCheckpointDir(dir);
  EXPECT_TRUE(reader.ok());
  auto w = LoadModelWeights(*parsed, **reader);
  EXPECT_TRUE(w.ok()) << w.status();
  return std::move(*w);
}

TEST(RandomModelTest, FastUniformIsDeterministicWithTheNormalSpread) {
  const auto config = SmallDcFormerConfig(64, 2, 4, 128, 300, 64, 16);
  testing::TempDir a, b, c;
  ASSERT_TRUE(WriteRandomModel(a.path(), config, DType::kF32, 9, RandomInit::kFastUniform).ok());
  ASSERT_TRUE(WriteRandomModel(b.path(), config, DType::kF32, 9, RandomInit::kFastUniform).ok());
  ASSERT_TRUE(WriteRandomModel(c.path(), config, DType::kF32, 10, RandomInit::kFastUniform).ok());
  const ModelWeights wa = Load(a.path(), config), wb = Load(b.path(), config),
                     wc = Load(c.path(), config);
  const Tensor& x = wa.layers[1].wqkv_w;  // [3E, E]: fan-in 64, stddev 1/8
  const int64_t n = x.numel();
  ASSERT_EQ(n, 3 * 64 * 64);
  double sum = 0, sq = 0;
  int same_as_other_seed = 0;
  const float bound = std::sqrt(3.0f) / 8;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x.f32()[i];
    ASSERT_EQ(v, wb.layers[1].wqkv_w.f32()[i]) << i;
    same_as_other_seed += v == wc.layers[1].wqkv_w.f32()[i];
    ASSERT_LE(std::fabs(v), bound);
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  EXPECT_LT(same_as_other_seed, 10);
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sq / n, 1.0 / 64, 0.05 / 64);
  // Different tensors are not copies of each other, and norms stay near 1.
  EXPECT_NE(wa.layers[0].wqkv_w.f32()[0], wa.layers[1].wqkv_w.f32()[0]);
  double norm = 0;
  for (int64_t i = 0; i < 64; ++i) norm += wa.layers[0].attention_norm_w.f32()[i];
  EXPECT_NEAR(norm / 64, 1.0, 0.01);
}

}  // namespace
}  // namespace dcf
