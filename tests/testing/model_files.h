// A small random DCFormer written to a temp dir, with its tensors held in memory so that a
// test can edit them (drop, rename, reshape, corrupt) and write the checkpoint again: the
// fixture of the weight-loading tests (tests/unit/model) and of the end-to-end loading tests
// (tests/unit/backends).
#pragma once

#include <string>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"
#include "engine/model/random_model.h"
#include "engine/weights/checkpoint.h"
#include "engine/weights/safetensors_writer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/temp_dir.h"

namespace dcf::testing {

class ModelFilesTest : public ::testing::Test {
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
  absl::Status LoadStatus(const WeightLoadOptions& options = {}) {
    auto reader = OpenCheckpointDir(dir_.path());
    if (!reader.ok()) return reader.status();
    return LoadModelWeights(config_, **reader, options).status();
  }
  size_t Index(const std::string& name) {
    for (size_t i = 0; i < names_.size(); ++i) {
      if (names_[i] == name) return i;
    }
    ADD_FAILURE() << name;
    return 0;
  }
  // Splits every layer's fused wqkv into wq, wk and wv (as some checkpoints store them).
  void SplitQkv() {
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
  }

  TempDir dir_;
  nlohmann::json config_json_;
  ModelConfig config_;
  std::vector<std::string> names_;
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<std::vector<float>> data_;
};

}  // namespace dcf::testing
