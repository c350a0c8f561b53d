// Weight validation against the config and alternative layouts (tests/unit/backends/
// model_loader_test.cc loads them end to end).
#include "engine/model/model_weights.h"

#include <cmath>
#include <fstream>
#include <limits>

#include "engine/common/memory_info.h"
#include "engine/model/random_model.h"
#include "engine/weights/checkpoint.h"
#include "engine/weights/safetensors_writer.h"
#include "gtest/gtest.h"
#include "tests/testing/model_files.h"
#include "tests/testing/peak_memory.h"
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

// A config.json that claims far more layers than the checkpoint holds is refused at once,
// naming n_layer, before anything is built per claimed layer (10^7 layers took ~24 GB and the
// OOM killer before the check). The layers counted are those the files hold from 0 up: one
// tiny tensor of a far layer (layers.9999999.*, 4 bytes) must not stretch the count to
// n_layer (it took 8.4 GB and a std::bad_alloc abort). The load's peak memory stays small.
TEST_F(ModelWeightsTest, MoreLayersThanTheCheckpointHoldsFailsAtOnce) {
  const auto refused_in_small_memory = [&](int n_layer) {
    config_.n_layer = n_layer;
    const bool reset = testing::ResetPeakResident();
    const size_t before = ProcessResidentBytes();
    const absl::Status st = LoadStatus();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << n_layer;
    EXPECT_NE(std::string(st.message()).find("n_layer is " + std::to_string(n_layer) +
                                             " but the checkpoint holds 2 layer(s) (no tensor "
                                             "'layers.2.*')"),
              std::string::npos)
        << st;
    if (reset) {  // nothing per claimed layer was built (8.6 GB for 10^7 layers)
      EXPECT_LT(testing::PeakResidentBytes(), before + (64u << 20)) << n_layer;
    }
  };
  for (int n_layer : {10000000, 3}) refused_in_small_memory(n_layer);
  names_.push_back("layers.9999999.attention.wo.weight");  // the spoof: 4 bytes
  shapes_.push_back({1});
  data_.push_back({0.5f});
  Rewrite();
  for (int n_layer : {10000000, 3}) refused_in_small_memory(n_layer);
  config_.n_layer = 2;  // the right count: the far layer's tensor is named
  absl::Status st = LoadStatus();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(st.message()).find("unexpected tensor 'layers.9999999.attention.wo"),
            std::string::npos)
      << st;
  names_.pop_back();
  shapes_.pop_back();
  data_.pop_back();
  Rewrite();
  config_.n_layer = 1;  // fewer: the extra layer's tensors are named
  st = LoadStatus();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(st.message()).find("unexpected tensor 'layers.1."), std::string::npos)
      << st;
}

// NaN or infinity in the weights (every 7th entry of one wo, as a corrupted file had): the
// opt-in scan refuses the checkpoint naming the tensor; without it the weights load (the
// engine then ends each request whose logits come out non-finite).
TEST_F(ModelWeightsTest, OptInScanRefusesNonFiniteWeights) {
  const size_t i = Index("layers.1.attention.wo.weight");
  for (size_t k = 6; k < data_[i].size(); k += 7) data_[i][k] = NAN;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    Rewrite(dtype);
    EXPECT_TRUE(LoadStatus().ok()) << LoadStatus();
    WeightLoadOptions scan;
    scan.check_finite = true;
    const absl::Status st = LoadStatus(scan);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << DTypeName(dtype);
    EXPECT_NE(std::string(st.message()).find("tensor 'layers.1.attention.wo.weight' holds " +
                                             std::to_string(data_[i].size() / 7) +
                                             " non-finite values (NaN or infinity), the first "
                                             "at flat index 6"),
              std::string::npos)
        << st;
    scan.dtype = std::nullopt;  // the stored dtype is scanned as it is
    EXPECT_EQ(LoadStatus(scan).code(), absl::StatusCode::kInvalidArgument);
  }
  data_[i][6] = INFINITY;  // an infinity alone is caught too
  for (size_t k = 13; k < data_[i].size(); k += 7) data_[i][k] = 0.5f;
  Rewrite();
  WeightLoadOptions scan;
  scan.check_finite = true;
  EXPECT_NE(std::string(LoadStatus(scan).message()).find("holds 1 non-finite"),
            std::string::npos);
  data_[i][6] = 0.5f;
  Rewrite();
  EXPECT_TRUE(LoadStatus(scan).ok());
}

// The scan judges the stored values: a finite F32 value beyond F16's range (65504) loaded as
// F16 is reported as what it is, not as a corrupt checkpoint (it was, before); a NaN stored
// in F32 is corrupt whatever the load converts to, counted as stored.
TEST_F(ModelWeightsTest, OptInScanTellsAConversionOutOfRangeFromCorruption) {
  const size_t i = Index("layers.1.attention.wo.weight");
  data_[i][6] = 1e5f;
  data_[i][20] = -7e4f;
  Rewrite();
  WeightLoadOptions scan;
  scan.check_finite = true;
  scan.dtype = DType::kF16;
  absl::Status st = LoadStatus(scan);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(std::string(st.message()).find("tensor 'layers.1.attention.wo.weight' holds 2 values "
                                           "beyond the range of F16, the first at flat index 6 "
                                           "(100000): converted from the checkpoint's F32"),
            std::string::npos)
      << st;
  EXPECT_EQ(std::string(st.message()).find("corrupt"), std::string::npos) << st;
  for (DType wide : {DType::kF32, DType::kBF16}) {
    scan.dtype = wide;
    EXPECT_TRUE(LoadStatus(scan).ok()) << DTypeName(wide) << ": " << LoadStatus(scan);
  }
  scan.dtype = std::nullopt;
  EXPECT_TRUE(LoadStatus(scan).ok()) << LoadStatus(scan);

  data_[i][13] = NAN;
  Rewrite();
  scan.dtype = DType::kF16;
  st = LoadStatus(scan);
  EXPECT_NE(std::string(st.message()).find("holds 1 non-finite values (NaN or infinity), the "
                                           "first at flat index 13: the checkpoint is corrupt"),
            std::string::npos)
      << st;
}

TEST(CountNonFiniteTest, EveryDType) {
  const float f[] = {1.0f, NAN, 2.0f, -INFINITY, 3.0f};
  int64_t first = 0;
  EXPECT_EQ(CountNonFinite(DType::kF32, f, 5, &first), 2);
  EXPECT_EQ(first, 1);
  uint16_t h[5], b[5];
  for (int k = 0; k < 5; ++k) {
    h[k] = FloatToHalf(f[k]);
    b[k] = FloatToBF16(f[k]);
  }
  EXPECT_EQ(CountNonFinite(DType::kF16, h, 5, &first), 2);
  EXPECT_EQ(CountNonFinite(DType::kBF16, b, 5, &first), 2);
  EXPECT_EQ(first, 1);
  const float finite[] = {0.0f, -0.0f, std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min()};
  EXPECT_EQ(CountNonFinite(DType::kF32, finite, 4, &first), 0);
  EXPECT_EQ(first, -1);
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
