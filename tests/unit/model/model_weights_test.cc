// Weight validation against the config, alternative layouts, and loading end to end.
#include "engine/model/model_weights.h"

#include <fstream>

#include "engine/backends/backend_factory.h"
#include "engine/model/random_model.h"
#include "engine/serving/sequence_runner.h"
#include "engine/weights/checkpoint.h"
#include "engine/weights/safetensors_writer.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace dcf {
namespace {

// A small model written to a temp dir, plus its tensors in memory for rewriting.
class ModelWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_json_ = SmallDcFormerConfig(32, 2, 4, 48, 64, 64, 8);
    ASSERT_TRUE(WriteRandomModel(dir_.path(), config_json_, DType::kF32, 3).ok());
    auto reader = OpenCheckpointDir(dir_.path());
    ASSERT_TRUE(reader.ok());
    for (const TensorInfo& t : (*reader)->tensors()) {
      names_.push_back(t.name);
      shapes_.push_back(t.shape);
      data_.emplace_back(t.NumElements());
      ASSERT_TRUE((*reader)->ReadF32(t.name, absl::MakeSpan(data_.back())).ok());
    }
    auto c = ModelConfig::FromJson(config_json_.dump());
    ASSERT_TRUE(c.ok());
    config_ = *c;
  }

  // Rewrites model.safetensors from the (possibly edited) tensor list.
  void Rewrite(DType dtype = DType::kF32) {
    std::vector<TensorToWrite> t;
    for (size_t i = 0; i < names_.size(); ++i) t.push_back({names_[i], shapes_[i], data_[i]});
    ASSERT_TRUE(WriteSafetensors(dir_.File("model.safetensors"), t, dtype).ok());
  }
  absl::Status LoadStatus() {
    auto reader = OpenCheckpointDir(dir_.path());
    if (!reader.ok()) return reader.status();
    return LoadModelWeights(config_, **reader).status();
  }
  size_t Index(const std::string& name) {
    for (size_t i = 0; i < names_.size(); ++i) {
      if (names_[i] == name) return i;
    }
    ADD_FAILURE() << name;
    return 0;
  }
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

  testing::TempDir dir_;
  nlohmann::json config_json_;
  ModelConfig config_;
  std::vector<std::string> names_;
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<std::vector<float>> data_;
};

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

TEST_F(ModelWeightsTest, SplitQkvEqualsFused) {
  const std::vector<float> reference = Logits();
  ASSERT_EQ(reference.size(), 10u * 64);
  for (int l = 0; l < config_.n_layer; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".attention.";
    const size_t i = Index(p + "wqkv.weight");
    const std::vector<float> fused = data_[i];
    const size_t part = fused.size() / 3;
    names_.erase(names_.begin() + i);
    shapes_.erase(shapes_.begin() + i);
    data_.erase(data_.begin() + i);
    for (int k = 0; k < 3; ++k) {
      names_.push_back(p + std::string(k == 0 ? "wq" : k == 1 ? "wk" : "wv") + ".weight");
      shapes_.push_back({config_.dim, config_.dim});
      data_.emplace_back(fused.begin() + k * part, fused.begin() + (k + 1) * part);
    }
  }
  Rewrite();
  EXPECT_EQ(Logits(), reference);
}

TEST_F(ModelWeightsTest, Bf16AndF16FilesLoad) {
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

TEST_F(ModelWeightsTest, WrongConfigForFileNamesTheTensor) {
  config_json_["intermediate_size"] = 50;
  std::ofstream(dir_.File("config.json")) << config_json_.dump();
  auto m = LoadModel(dir_.path());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(std::string(m.status().message()).find("feed_forward.w1.weight"), std::string::npos)
      << m.status();
}

TEST(ModelLoaderTest, ReportsMissingPieces) {
  testing::TempDir dir;
  EXPECT_EQ(LoadModel(dir.path()).status().code(), absl::StatusCode::kNotFound);  // no config
  std::ofstream(dir.File("config.json")) << SmallDcFormerConfig(32, 2, 4, 48, 64, 64, 8).dump();
  auto m = LoadModel(dir.path());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);  // no weights
}

}  // namespace
}  // namespace dcf
