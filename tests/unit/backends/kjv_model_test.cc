// The trained default model (models/dcformer-kjv) through the engine, against the code that
// trained it (tests/data/kjv/reference.json, written by models/train/make_reference.py with
// the committed bf16 weights computed in fp32): a third oracle beside tests/data/golden.
// Also its held-out perplexity as dcformer-generate --score measures it, against a bound and
// against a random-weight model of the same shape and tokenizer.
#include <cmath>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/backends/backend_factory.h"
#include "engine/serving/sequence_runner.h"
#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace dcf {
namespace {

constexpr double kLogitTolerance = 1e-4;  // as for the golden checkpoints
// Held-out perplexity bound for the trained model (it measures 58.6; see
// models/dcformer-kjv/README.md), and the least factor by which a random-weight model of the
// same shape must be worse.
constexpr double kMaxHeldoutPerplexity = 70;
constexpr double kMinRandomFactor = 50;
// The most int8 weight-only may raise the held-out perplexity (the goal: +1%).
constexpr double kMaxInt8PerplexityRatio = 1.01;
// And int8 x int8 (--activation-dtype int8; the goal: +3%).
constexpr double kMaxInt8x8PerplexityRatio = 1.03;

const std::string kModelDir = std::string(DCF_SOURCE_DIR) + "/models/dcformer-kjv";
const std::string kGenerate = std::string(DCF_BIN_DIR) + "/dcformer-generate";

nlohmann::json LoadReference() {
  std::ifstream in(std::string(DCF_TEST_DATA_DIR) + "/kjv/reference.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

class KjvModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    BackendOptions options;
    options.kind = BackendKind::kCpu;  // the oracle: fp32 math, whatever devices exist
    auto m = LoadModel(kModelDir, options);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = new LoadedModel(std::move(*m));
    ref_ = new nlohmann::json(LoadReference());
  }
  static void TearDownTestSuite() {
    delete model_;
    delete ref_;
  }

  // Logits of every token of the reference window, fed in chunks of `chunk`.
  std::vector<float> RunWindow(int chunk) {
    auto runner = SequenceRunner::Create(model_->backend.get());
    EXPECT_TRUE(runner.ok()) << runner.status();
    const auto tokens = ref_->at("tokens").get<std::vector<int32_t>>();
    std::vector<float> logits;  // [T, V] f32
    auto st = (*runner)->Append(tokens, chunk, &logits);
    EXPECT_TRUE(st.ok()) << st;
    return logits;
  }

  static LoadedModel* model_;
  static nlohmann::json* ref_;
};

LoadedModel* KjvModelTest::model_ = nullptr;
nlohmann::json* KjvModelTest::ref_ = nullptr;

TEST_F(KjvModelTest, HeldoutLogitsMatchTrainingCode) {
  const int V = model_->config.vocab_size;
  const auto tokens = ref_->at("tokens").get<std::vector<int32_t>>();
  const auto sample = ref_->at("vocab_sample").get<std::vector<int>>();
  const auto at_sample = ref_->at("logits_at_sample").get<std::vector<std::vector<double>>>();
  const auto next = ref_->at("logit_of_next").get<std::vector<double>>();
  const auto lse = ref_->at("logsumexp").get<std::vector<double>>();
  ASSERT_EQ(static_cast<int>(tokens.size()), model_->config.max_positions);
  for (int chunk : {static_cast<int>(tokens.size()), 1, 100}) {
    SCOPED_TRACE(absl::StrCat("chunk ", chunk));
    const std::vector<float> logits = RunWindow(chunk);
    ASSERT_EQ(logits.size(), tokens.size() * V);
    double worst = 0;
    auto check = [&](double got, double want, size_t t, const char* what) {
      worst = std::max(worst, std::abs(got - want));
      ASSERT_NEAR(got, want, kLogitTolerance) << what << " at position " << t;
    };
    for (size_t t = 0; t < tokens.size(); ++t) {
      const float* row = &logits[t * V];
      for (size_t i = 0; i < sample.size(); ++i) check(row[sample[i]], at_sample[t][i], t, "logit");
      if (t + 1 < tokens.size()) check(row[tokens[t + 1]], next[t], t, "next-token logit");
      double mx = row[0], sum = 0;
      for (int v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(row[v]));
      for (int v = 0; v < V; ++v) sum += std::exp(row[v] - mx);
      check(mx + std::log(sum), lse[t], t, "log-sum-exp");
    }
    for (const auto& [pos, want] : ref_->at("full_rows").items()) {
      const size_t t = std::stoul(pos);
      const auto row = want.get<std::vector<double>>();
      ASSERT_EQ(static_cast<int>(row.size()), V);
      for (int v = 0; v < V; ++v) check(logits[t * V + v], row[v], t, "full-row logit");
    }
    RecordProperty(absl::StrCat("max_abs_error_chunk", chunk), std::to_string(worst));
  }
}

TEST_F(KjvModelTest, GreedyContinuationIsAsCommitted) {
  const auto& g = ref_->at("greedy");
  auto tok = Tokenizer::FromModelDir(kModelDir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto prompt = (*tok)->Encode(g.at("prompt").get<std::string>());
  ASSERT_TRUE(prompt.ok());
  EXPECT_EQ(*prompt, g.at("prompt_ids").get<std::vector<int32_t>>());
  auto runner = SequenceRunner::Create(model_->backend.get());
  ASSERT_TRUE(runner.ok()) << runner.status();
  const auto want = g.at("tokens").get<std::vector<int32_t>>();
  auto got = (*runner)->Greedy(*prompt, static_cast<int>(want.size()), 16);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->tokens, want);
  auto text = (*tok)->Decode(got->tokens);
  ASSERT_TRUE(text.ok());
  RecordProperty("continuation", *text);
}

double ScorePerplexity(const std::string& model_dir, const std::string& text_file,
                       const std::string& flags = "") {
  const auto r = testing::RunCommand(kGenerate + " --model " + model_dir + " --score " + text_file +
                                     flags);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  if (r.exit_code != 0) return NAN;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_NEAR(std::exp(j.at("mean_nll").get<double>()), j.at("perplexity").get<double>(), 1e-6);
  return j.at("perplexity").get<double>();
}

TEST_F(KjvModelTest, HeldoutPerplexityIsLowAndFarBelowRandomWeights) {
  const std::string heldout = std::string(DCF_TEST_DATA_DIR) + "/kjv/heldout.txt";
  const double trained = ScorePerplexity(kModelDir, heldout);
  EXPECT_LT(trained, kMaxHeldoutPerplexity);
  // The engine's number is the training code's (same windows, same weights).
  EXPECT_NEAR(trained, ref_->at("heldout").at("perplexity").get<double>(), 1e-3 * trained);

  // A random-weight model of the same shape and tokenizer, on the first held-out chapters.
  testing::TempDir dir;
  const auto c = model_->config;
  const auto made = testing::RunCommand(absl::StrCat(
      DCF_BIN_DIR, "/dcformer-make-model --out ", dir.path(), " --dim ", c.dim, " --n-layer ",
      c.n_layer, " --n-head ", c.n_head, " --ffn ", c.intermediate_size, " --vocab ", c.vocab_size,
      " --context ", c.max_positions, " --window ", c.window_size));
  ASSERT_EQ(made.exit_code, 0) << made.err;
  std::ifstream tok_in(kModelDir + "/tokenizer.json", std::ios::binary);
  std::stringstream tok_text;
  tok_text << tok_in.rdbuf();
  dir.Write("tokenizer.json", tok_text.str());
  std::ifstream held_in(heldout, std::ios::binary);
  std::stringstream held_text;
  held_text << held_in.rdbuf();
  dir.Write("part.txt", held_text.str().substr(0, 12000));
  const double random = ScorePerplexity(dir.path(), dir.File("part.txt"));
  EXPECT_GT(random, kMinRandomFactor * trained);
  RecordProperty("heldout_perplexity", std::to_string(trained));
  RecordProperty("random_model_perplexity", std::to_string(random));
}

// int8 weight-only (--weight-dtype int8, default group size) costs at most 1% held-out
// perplexity against the committed bf16 weights, and int8 x int8 (--activation-dtype int8 as
// well) at most 3% (docs/QUANTIZATION.md). One test: the three scores share the bf16 one.
TEST_F(KjvModelTest, HeldoutPerplexityWithInt8IsWithinTheGoals) {
  const std::string heldout = std::string(DCF_TEST_DATA_DIR) + "/kjv/heldout.txt";
  const double bf16 = ScorePerplexity(kModelDir, heldout, " --backend cpu");
  const std::string int8 = " --backend cpu --weight-dtype int8";
  const double w8 = ScorePerplexity(kModelDir, heldout, int8);
  const double w8a8 = ScorePerplexity(kModelDir, heldout, int8 + " --activation-dtype int8");
  EXPECT_LE(w8, kMaxInt8PerplexityRatio * bf16) << "bf16 " << bf16 << ", int8 " << w8;
  EXPECT_LE(w8a8, kMaxInt8x8PerplexityRatio * bf16) << "bf16 " << bf16 << ", int8 x int8 " << w8a8;
  // Quantization changes the logits: equal numbers would mean a flag did nothing.
  EXPECT_NE(w8, bf16);
  EXPECT_NE(w8a8, w8);
  std::cout << "held-out perplexity: bf16 " << bf16 << ", int8 weights " << w8 << ", int8 x int8 "
            << w8a8 << "\n";
  RecordProperty("heldout_perplexity_bf16", std::to_string(bf16));
  RecordProperty("heldout_perplexity_int8", std::to_string(w8));
  RecordProperty("heldout_perplexity_int8x8", std::to_string(w8a8));
}

// The GPU's int8 and fp8 weights (per output channel, docs/QUANTIZATION.md "GPU") on cuda-sim,
// against cuda-sim's own bfloat16, on the first 2,500 characters of the held-out text (three
// 256-token windows; the whole text takes about an hour of emulation for the four runs:
// docs/QUANTIZATION.md has that measurement):
// weight-only within the issue's +1%, fp8 activations within +3%. --score reads whole
// 256-token windows, so these are the library path's products (gemm_quant.h).
TEST_F(KjvModelTest, CudaSimPerplexityWithInt8AndFp8IsWithinTheGoals) {
  testing::TempDir dir;
  std::ifstream held_in(std::string(DCF_TEST_DATA_DIR) + "/kjv/heldout.txt", std::ios::binary);
  std::stringstream held_text;
  held_text << held_in.rdbuf();
  dir.Write("part.txt", held_text.str().substr(0, 2500));
  const std::string sim = " --backend cuda-sim --dtype bfloat16";
  const double bf16 = ScorePerplexity(kModelDir, dir.File("part.txt"), sim);
  const double w8 = ScorePerplexity(kModelDir, dir.File("part.txt"), sim + " --weight-dtype int8");
  const double f8 = ScorePerplexity(kModelDir, dir.File("part.txt"), sim + " --weight-dtype fp8");
  const double f8a8 = ScorePerplexity(kModelDir, dir.File("part.txt"),
                                      sim + " --weight-dtype fp8 --activation-dtype fp8");
  std::cout << "cuda-sim perplexity (first 2500 characters of the held-out text): bf16 " << bf16
            << ", int8 " << w8 << ", fp8 " << f8 << ", fp8 x fp8 " << f8a8 << "\n";
  EXPECT_LE(w8, kMaxInt8PerplexityRatio * bf16) << "bf16 " << bf16 << ", int8 " << w8;
  EXPECT_LE(f8, kMaxInt8PerplexityRatio * bf16) << "bf16 " << bf16 << ", fp8 " << f8;
  EXPECT_LE(f8a8, kMaxInt8x8PerplexityRatio * bf16) << "bf16 " << bf16 << ", fp8 x fp8 " << f8a8;
  // Each flag changed the logits.
  EXPECT_NE(w8, bf16);
  EXPECT_NE(f8, bf16);
  EXPECT_NE(f8a8, f8);
  RecordProperty("cuda_sim_perplexity_bf16", std::to_string(bf16));
  RecordProperty("cuda_sim_perplexity_int8", std::to_string(w8));
  RecordProperty("cuda_sim_perplexity_fp8", std::to_string(f8));
  RecordProperty("cuda_sim_perplexity_fp8x8", std::to_string(f8a8));
}

}  // namespace
}  // namespace dcf
