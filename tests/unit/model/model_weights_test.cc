// Weight validation against the config and alternative layouts (tests/unit/backends/
// model_loader_test.cc loads them end to end).
#include "engine/model/model_weights.h"

#include <fstream>

#include "engine/model/random_model.h"
#include "engine/weights/checkpoint.h"
#include "engine/weights/safetensors_writer.h"
#include "gtest/gtest.h"
#include "tests/testing/model_files.h"
#include "tests/testing/temp_dir.h"

namespace dcf {
namespace {

using ModelWeightsTest = testing::ModelFilesTest;

TEST_F(ModelWeightsTest, LoadsGeneratedModel) {
  EXPECT_TRUE(LoadStatus().ok()) << LoadStatus();
  EXPECT_EQ(ExpectedTensors(config_).size(), names_.size());
}

TEST_F(ModelWeightsTest, MissingTensorIsNamed) {
  const size_t i = Index("layers.1.attention.dyn_w_proj.qkw");
  names_.erase(names_.begin() + i);
  shapes_.erase(shapes_.begin() + i);
  data_.erase(data_.begin() + i);
  Rewrite();
  const absl::Status st = LoadStatus();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(st.message()).find("layers.1.attention.dyn_w_proj.qkw' is missing"),
            std::string::npos) << st;
}

TEST_F(ModelWeightsTest, ExtraTensorIsNamedButDerivedKeysAreIgnored) {
  for (const char* ignored :
       {"layers.0.attention.dyn_w_proj.dw_m", "layers.0.attention.dyn_w_proj.qkw_m",
        "layers.0.attention.dyn_w_proj.pre_proj.w", "layers.1.attention.dyn_w_proj.post_proj.w",
        "layers.0.attention.kv_cache.k_cache"}) {
    names_.push_back(ignored);
    shapes_.push_back({2});
    data_.push_back({1, 2});
  }
  Rewrite();
  EXPECT_TRUE(LoadStatus().ok()) << LoadStatus();
  names_.push_back("layers.0.attention.extra_proj");
  shapes_.push_back({2});
  data_.push_back({1, 2});
  Rewrite();
  const absl::Status st = LoadStatus();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(st.message()).find("layers.0.attention.extra_proj"), std::string::npos);
}

TEST_F(ModelWeightsTest, MisshapenTensorIsNamed) {
  const size_t i = Index("layers.0.attention.wo.weight");
  shapes_[i] = {16, 64};  // same element count, wrong shape
  Rewrite();
  const absl::Status st = LoadStatus();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(st.message()).find("layers.0.attention.wo.weight' has shape [16, 64]"),
            std::string::npos) << st;
}

// A BF16 checkpoint loads as BF16 when asked to keep the stored dtype, and as the exact
// widening when asked for F32.
TEST(TensorTest, LoadKeepsOrConvertsTheStoredDtype) {
  testing::TempDir dir;
  const auto config = SmallDcFormerConfig(32, 2, 4, 64, 50, 32, 8);
  ASSERT_TRUE(WriteRandomModel(dir.path(), config, DType::kBF16, 5).ok());
  auto parsed = ModelConfig::FromJson(config.dump());
  ASSERT_TRUE(parsed.ok());
  auto reader = OpenCheckpointDir(dir.path());
  ASSERT_TRUE(reader.ok());
  WeightLoadOptions keep;
  keep.dtype = std::nullopt;
  auto raw = LoadModelWeights(*parsed, **reader, keep);
  ASSERT_TRUE(raw.ok()) << raw.status();
  reader = OpenCheckpointDir(dir.path());
  ASSERT_TRUE(reader.ok());
  auto f32 = LoadModelWeights(*parsed, **reader);
  ASSERT_TRUE(f32.ok()) << f32.status();
  const Tensor& a = raw->layers[1].wqkv_w;
  const Tensor& b = f32->layers[1].wqkv_w;
  ASSERT_EQ(a.dtype(), DType::kBF16);
  ASSERT_EQ(b.dtype(), DType::kF32);
  ASSERT_EQ(a.numel(), b.numel());
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(BF16ToFloat(a.u16()[i]), b.f32()[i]);
  EXPECT_EQ(raw->NumParameters(), f32->NumParameters());
  EXPECT_EQ(2 * raw->NumBytes(), f32->NumBytes());
}

}  // namespace
}  // namespace dcf
