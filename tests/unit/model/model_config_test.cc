#include "engine/model/model_config.h"

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/golden.h"

namespace dcf {
namespace {

using Json = nlohmann::json;

Json BaseConfig() {
  return Json::parse(R"({"model_type": "dcformer", "dim": 128, "n_layer": 8, "n_head": 8,
    "n_local_heads": 8, "head_dim": 99, "intermediate_size": 512, "vocab_size": 300,
    "block_size": 256, "window_size": 16, "window_type": null, "use_qk_norm": true,
    "rope_base": 10000.0, "norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2})");
}

absl::Status ParseError(const Json& j) { return ModelConfig::FromJson(j.dump()).status(); }

TEST(ModelConfigTest, ParsesGoldenConfigs) {
  auto c = ModelConfig::FromFile(testing::GoldenDir("dcformer-f32-short-prompt") + "/config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, Architecture::kDcFormer);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->rotary_dim, 16);
  EXPECT_EQ(c->window_size, 16);
  EXPECT_FALSE(c->parallel_residual);
  auto p = ModelConfig::FromFile(testing::GoldenDir("dcpythia-f16-bin") + "/config.json");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->architecture, Architecture::kDcPythia);
  EXPECT_EQ(p->head_dim, 32);
  EXPECT_EQ(p->rotary_dim, 8);  // int(32 * 0.25)
  EXPECT_TRUE(p->parallel_residual);
  EXPECT_TRUE(p->linear_bias);
  EXPECT_DOUBLE_EQ(p->norm_eps, 1e-5);
}

TEST(ModelConfigTest, HeadDimInFileIsIgnored) {
  auto c = ModelConfig::FromJson(BaseConfig().dump());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->head_dim, 16);
}

TEST(ModelConfigTest, WindowPatterns) {
  Json j = BaseConfig();
  auto locals = [&](const Json& cfg) {
    auto c = ModelConfig::FromJson(cfg.dump());
    EXPECT_TRUE(c.ok()) << c.status();
    std::string s;
    for (int l = 0; l < c->n_layer; ++l) s += c->IsLocalLayer(l) ? 'L' : 'G';
    return s;
  };
  EXPECT_EQ(locals(j), "LGLGLGLG");  // window_type null
  j["window_type"] = "LG";
  EXPECT_EQ(locals(j), "LGLGLGLG");
  j["window_type"] = "LGLL";
  EXPECT_EQ(locals(j), "LGLLLGLL");
  j["window_type"] = "LGL6";
  EXPECT_EQ(locals(j), "LGLLLLLL");
  j["window_size"] = nullptr;
  EXPECT_EQ(locals(j), "GGGGGGGG");

  auto c = ModelConfig::FromJson(BaseConfig().dump());
  EXPECT_EQ(c->NumLayersIn(LayerGroup::kWindow), 4);
  EXPECT_EQ(c->NumLayersIn(LayerGroup::kGlobal), 4);
  EXPECT_EQ(c->IndexInGroup(5), 2);  // layers 1, 3, 5: third global layer
  EXPECT_EQ(c->IndexInGroup(4), 2);  // layers 0, 2, 4: third window layer
}

struct BadCase {
  const char* key;
  Json value;  // null-object value means "remove the key"
  const char* message_part;
};

TEST(ModelConfigTest, RefusesUnsupportedValuesNamingTheKey) {
  const std::vector<BadCase> cases = {
      {"model_type", "llama", "model_type"},
      {"dim", nullptr, "'dim' is missing"},
      {"dim", 130, "dim"},
      {"n_head", 0, "n_head"},
      {"n_local_heads", 4, "n_local_heads"},
      {"vocab_size", "300", "vocab_size"},
      {"window_type", "GL", "window_type"},
      {"window_size", -3, "window_size"},
      {"window_size", 4294967297LL, "window_size"},  // must not wrap to 1
      // The context sizes per-position tables (CUDA's RoPE tables took 12.5 GB for 10^8).
      {"block_size", 100000000, "'block_size' is 100000000, more than the 1048576 positions"},
      {"block_size", 1 << 30, "'block_size' is 1073741824, more than the 1048576 positions"},
      {"block_size", (1 << 20) + 1, "more than the 1048576 positions"},
      {"eos_token_id", 99999999999LL, "eos_token_id"},
      {"bos_token_id", -1, "bos_token_id"},
      {"use_qk_norm", "yes", "use_qk_norm"},
      {"rope_base", -1.0, "rope_base"},
      {"norm_eps", 0.0, "norm_eps"},
      {"use_dcmha", false, "use_dcmha"},
      {"query_wise", true, "query_wise"},
      {"tie_word_embeddings", true, "tie_word_embeddings"},
      {"use_parallel_residual", true, "use_parallel_residual"},
  };
  for (const BadCase& bc : cases) {
    Json j = BaseConfig();
    if (bc.value.is_null() && std::string(bc.key) == "dim") {
      j.erase(bc.key);
    } else {
      j[bc.key] = bc.value;
    }
    const absl::Status st = ParseError(j);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bc.key;
    EXPECT_NE(std::string(st.message()).find(bc.message_part), std::string::npos)
        << bc.key << ": " << st.message();
  }
  Json longest = BaseConfig();
  longest["block_size"] = ModelConfig::kMaxPositions;  // the cap itself is served
  EXPECT_TRUE(ModelConfig::FromJson(longest.dump()).ok());
  EXPECT_FALSE(ModelConfig::FromJson("{not json").ok());
  EXPECT_EQ(ModelConfig::FromFile("/nonexistent/config.json").status().code(),
            absl::StatusCode::kNotFound);
}

// config.json's quantization_config (dcformer-quantize, docs/QUANTIZATION.md): the group
// size of an int8 checkpoint, and nothing else this engine cannot read.
TEST(ModelConfigTest, Int8QuantizationConfig) {
  EXPECT_EQ(ModelConfig::FromJson(BaseConfig().dump())->int8_group_size, 0);
  for (const int group : {32, 64, 128}) {
    Json j = BaseConfig();
    j["quantization_config"] = {{"quant_method", "dcformer-int8"}, {"group_size", group}};
    auto c = ModelConfig::FromJson(j.dump());
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->int8_group_size, group);
  }
  const std::vector<std::pair<Json, std::string>> bad = {
      {{{"quant_method", "gptq"}, {"group_size", 64}}, "quantization_config"},
      {{{"quant_method", "dcformer-int8"}, {"group_size", 48}}, "group_size 48"},
      {{{"quant_method", "dcformer-int8"}}, "'group_size' is missing"},
      {Json("int8"), "quantization_config"},
  };
  for (const auto& [q, want] : bad) {
    Json j = BaseConfig();
    j["quantization_config"] = q;
    const absl::Status s = ParseError(j);
    EXPECT_FALSE(s.ok()) << q.dump();
    EXPECT_NE(s.message().find(want), std::string::npos) << s;
  }
}

TEST(ModelConfigTest, DcPythiaRotaryPct) {
  Json j = BaseConfig();
  j["model_type"] = "dcpythia";
  j["rotary_pct"] = 0.5;
  auto c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rotary_dim, 8);
  j["rotary_pct"] = 1.5;
  EXPECT_NE(std::string(ParseError(j).message()).find("rotary_pct"), std::string::npos);
  j["rotary_pct"] = 0.0625;  // 16 * 0.0625 = 1 rotary dim: odd
  EXPECT_NE(std::string(ParseError(j).message()).find("rotary_pct"), std::string::npos);
}

}  // namespace
}  // namespace dcf
