// dcformer-generate as a user runs it: golden greedy tokens and logprobs, text prompts,
// --tokenize, and clean failures.
#include <algorithm>
#include <cmath>
#include <fstream>

#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/golden.h"
#include "tests/testing/model_files.h"
#include "tests/testing/subprocess.h"

namespace dcf {
namespace {

const std::string kGenerate = std::string(DCF_BIN_DIR) + "/dcformer-generate";

TEST(GenerateCliTest, ReproducesGoldenGreedyTokensAndLogprobs) {
  for (const std::string& name : testing::GoldenCases()) {
    const testing::Golden g = testing::LoadGolden(name);
    const auto r = testing::RunCommand(
        kGenerate + " --model " + testing::GoldenDir(name) + " --prompt-ids " +
        absl::StrJoin(g.prompt, ",") + " --max-new-tokens " + std::to_string(g.greedy.size()) +
        " --json");
    ASSERT_EQ(r.exit_code, 0) << name << ": " << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j.at("tokens").get<std::vector<int32_t>>(), g.greedy) << name;
    const auto lp = j.at("logprobs").get<std::vector<double>>();
    ASSERT_EQ(lp.size(), g.greedy_logprobs.size());
    for (size_t i = 0; i < lp.size(); ++i) EXPECT_NEAR(lp[i], g.greedy_logprobs[i], 1e-4) << i;
    EXPECT_FALSE(j.contains("text"));  // golden models have no tokenizer

    // Plain output: the ids, comma-separated.
    const auto plain = testing::RunCommand(
        kGenerate + " --model " + testing::GoldenDir(name) + " --prompt-ids " +
        absl::StrJoin(g.prompt, ",") + " --max-new-tokens 5");
    ASSERT_EQ(plain.exit_code, 0);
    std::vector<int32_t> first5(g.greedy.begin(), g.greedy.begin() + 5);
    EXPECT_EQ(plain.out, absl::StrJoin(first5, ",") + "\n");
  }
}

// DCF_SIM_GEMV=1: the CUDA backend's decode-sized products (prompt chunks and decode
// steps of <= 16 tokens) run LaunchGemv with the norm in its prologue (RMSNorm; dcpythia's
// LayerNorm) and its SwiGLU / GELU epilogue, as on a GPU, instead of the emulator's library
// GEMM; still the golden tokens and logprobs (8 decode steps: the GEMV's GPU-sized grid costs
// the emulator ~2 s a step).
TEST(GenerateCliTest, CudaSimGemvPathReproducesGoldenGreedy) {
  for (const std::string name : {"dcformer-f32-short-prompt", "dcpythia-f16-bin"}) {
    SCOPED_TRACE(name);
    const testing::Golden g = testing::LoadGolden(name);
    const size_t n = std::min<size_t>(8, g.greedy.size());
    const auto r = testing::RunCommand(
        "DCF_SIM_GEMV=1 " + kGenerate + " --model " + testing::GoldenDir(name) +
        " --prompt-ids " + absl::StrJoin(g.prompt, ",") +
        " --json --backend cuda-sim --dtype float32" + " --max-new-tokens " + std::to_string(n));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j.at("tokens").get<std::vector<int32_t>>(),
              std::vector<int32_t>(g.greedy.begin(), g.greedy.begin() + n));
    const auto lp = j.at("logprobs").get<std::vector<double>>();
    ASSERT_EQ(lp.size(), n);
    for (size_t i = 0; i < n; ++i) EXPECT_NEAR(lp[i], g.greedy_logprobs[i], 1e-4) << i;
  }
}

// --backend cuda-sim runs the CUDA backend's kernels on the SIMT emulator; --json names the
// backend and dtype that ran (bfloat16 by default, like a GPU). In float32 it reproduces the
// golden tokens and logprobs.
TEST(GenerateCliTest, CudaSimNamesTheBackendAndDtypeThatRan) {
  const std::string name = "dcformer-f32-long-prompt";
  const testing::Golden g = testing::LoadGolden(name);
  const std::string base = kGenerate + " --model " + testing::GoldenDir(name) +
                           " --prompt-ids " + absl::StrJoin(g.prompt, ",") +
                           " --json --backend cuda-sim --max-new-tokens ";
  const auto f32 = testing::RunCommand(base + std::to_string(g.greedy.size()) +
                                       " --dtype float32");
  ASSERT_EQ(f32.exit_code, 0) << f32.err;
  const auto j = nlohmann::json::parse(f32.out);
  EXPECT_EQ(j.at("backend"), "cuda-sim");
  EXPECT_EQ(j.at("dtype"), "float32");
  EXPECT_EQ(j.at("tokens").get<std::vector<int32_t>>(), g.greedy);
  const auto lp = j.at("logprobs").get<std::vector<double>>();
  ASSERT_EQ(lp.size(), g.greedy_logprobs.size());
  for (size_t i = 0; i < lp.size(); ++i) EXPECT_NEAR(lp[i], g.greedy_logprobs[i], 1e-4) << i;

  const auto bf16 = testing::RunCommand(base + "4");
  ASSERT_EQ(bf16.exit_code, 0) << bf16.err;
  const auto b = nlohmann::json::parse(bf16.out);
  EXPECT_EQ(b.at("backend"), "cuda-sim");
  EXPECT_EQ(b.at("dtype"), "bfloat16");
  EXPECT_EQ(b.at("tokens").size(), 4u);
}

TEST(GenerateCliTest, TextPromptOnDefaultModel) {
  const auto r = testing::RunCommand(kGenerate + " --prompt 'In the beginning' "
                                                 "--max-new-tokens 4 --json --ignore-eos");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("tokens").size(), 4u);
  EXPECT_TRUE(j.at("text").is_string());
  // The same prompt given as ids (the default model's tokenizer, models/dcformer-kjv:
  // "In" 1131, " the" 259, " beginning" 2049) gives the same tokens.
  const auto ids = testing::RunCommand(kGenerate + " --prompt-ids 1131,259,2049 "
                                                   "--max-new-tokens 4 --json --ignore-eos");
  ASSERT_EQ(ids.exit_code, 0) << ids.err;
  EXPECT_EQ(nlohmann::json::parse(ids.out).at("tokens"), j.at("tokens"));

  // What README's "Offline tools" documents: the JSON's fields, and plain output as the ids
  // on the first line, then (a tokenizer being present) their text.
  std::vector<std::string> keys;
  const auto ordered = nlohmann::ordered_json::parse(r.out);  // the keys as printed
  for (const auto& [key, value] : ordered.items()) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{"tokens", "logprobs", "backend", "dtype", "weights",
                                            "text"}));
  EXPECT_TRUE(j.at("backend").is_string());  // what --backend auto resolved to
  const auto plain = testing::RunCommand(kGenerate +
                                         " --prompt 'In the beginning' "
                                         "--max-new-tokens 4 --ignore-eos");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_EQ(plain.out, absl::StrJoin(j.at("tokens").get<std::vector<int32_t>>(), ",") + "\n" +
                           j.at("text").get<std::string>() + "\n");
}

// The server's rule (issue 24): the prompt plus --max-new-tokens must fit the context, or the
// tool fails with the server's OUT_OF_RANGE message instead of stopping short; a request that
// fits exactly generates every token it asked for.
TEST(GenerateCliTest, MaxNewTokensBeyondTheContextFailsLikeTheServer) {
  std::string prompt = "1";
  for (int i = 0; i < 249; ++i) prompt += ",2";  // 250 of the golden model's 256 positions
  const std::string base = kGenerate + " --model " +
                           testing::GoldenDir("dcformer-f32-short-prompt") + " --prompt-ids " +
                           prompt + " --json --max-new-tokens ";
  const auto over = testing::RunCommand(base + "50");
  EXPECT_EQ(over.exit_code, 1);
  EXPECT_NE(over.err.find("stopping.max_new_tokens: prompt (250 tokens) + max_new_tokens (50) = "
                          "300 exceeds the model context of 256 tokens"),
            std::string::npos)
      << over.err;
  EXPECT_TRUE(over.out.empty());
  const auto exact = testing::RunCommand(base + "6");
  ASSERT_EQ(exact.exit_code, 0) << exact.err;
  EXPECT_EQ(nlohmann::json::parse(exact.out).at("tokens").size(), 6u);
}

TEST(GenerateCliTest, TokenizeMatchesReferenceCases) {
  std::ifstream in(std::string(DCF_TEST_DATA_DIR) + "/tokenizer/gpt2/cases.jsonl");
  std::string line;
  int checked = 0;
  while (std::getline(in, line) && checked < 5) {
    const auto c = nlohmann::json::parse(line);
    const auto r = testing::RunCommand(
        kGenerate + " --tokenizer " + DCF_TEST_DATA_DIR + "/tokenizer/gpt2/tokenizer.json --tokenize",
        c.at("text").get<std::string>());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out), c.at("ids")) << c.at("text");
    ++checked;
  }
  EXPECT_EQ(checked, 5);
}

TEST(GenerateCliTest, BadInputsFailWithAMessage) {
  const std::string golden = " --model " + testing::GoldenDir("dcformer-f32-short-prompt");
  struct Case {
    std::string args;
    int code;
    std::string message_part;
  };
  const std::vector<Case> cases = {
      {golden + " --prompt-ids 1,2,x", 2, "'x' is not an integer"},
      {golden + " --prompt-ids 1,300", 1,
       "prompt_tokens[1]: token id 300 is outside the model vocabulary"},
      {golden + " --prompt-ids -1", 1, "token id -1"},
      {golden + " --prompt 'hi'", 2, "needs a tokenizer"},
      {golden, 2, "exactly one of"},
      {golden + " --prompt-ids 1 --max-new-tokens -1", 2, "--max-new-tokens"},
      {golden + " --prompt-ids 1 --max-new-tokens 0", 2, "--max-new-tokens must be >= 1"},
      {" --model /nonexistent --prompt-ids 1", 1, "/nonexistent/config.json"},
      {golden + " --prompt-ids 1 --bogus-flag", 2, "unknown flag --bogus-flag"},
      {golden + " --prompt-ids 1 --max-new-tokens", 2, "--max-new-tokens needs a value"},
      // README's two examples (review finding 5), on a model of the default one's context (256).
      {golden + " --prompt-ids 1,2,3 --max-new-tokens 254", 1,
       "dcformer-generate: stopping.max_new_tokens: prompt (3 tokens) + max_new_tokens (254) = "
       "257 exceeds the model context of 256 tokens\n"},
      {golden + " --prompt-ids 1,2,3 --max-new-tokens 300", 1,
       "dcformer-generate: stopping.max_new_tokens: 300 exceeds the limit of 256\n"},
      {" --tokenize", 2, "--tokenizer"},
      {golden + " --prompt-ids " +
           [] {
             std::string s = "1";
             for (int i = 0; i < 256; ++i) s += ",1";
             return s;
           }() +
           " --max-new-tokens 1",
       1, "prompt_tokens: 257 tokens exceed the limit of 256"},
      // The GPT-2 tokenizer knows <|endoftext|> = 50256; the golden model has 300 tokens.
      {golden + " --tokenizer " + DCF_TEST_DATA_DIR + "/tokenizer/gpt2/tokenizer.json" +
           " --prompt '<|endoftext|>'",
       1, "prompt_tokens[0]: token id 50256 is outside"},
      {golden + " --score /dev/null", 2, "--score needs a tokenizer"},
      {" --score /nonexistent.txt", 1, "--score: cannot open '/nonexistent.txt'"},
      {golden + " --tokenizer " + DCF_TEST_DATA_DIR + "/tokenizer/gpt2/tokenizer.json" +
           " --score " + DCF_TEST_DATA_DIR + "/kjv/heldout.txt", 1, "is outside the model vocabulary"},
  };
  for (const Case& c : cases) {
    const auto r = testing::RunCommand(kGenerate + c.args);
    EXPECT_EQ(r.exit_code, c.code) << c.args << "\n" << r.err;
    EXPECT_NE(r.err.find(c.message_part), std::string::npos) << c.args << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << c.args;
  }
}

// A checkpoint with NaN in one wo: generation fails with a message that says the logits are
// not finite (exit 1, no silent tokens); --check-weights refuses it at load, naming the tensor.
using GenerateCorruptModelTest = testing::ModelFilesTest;
TEST_F(GenerateCorruptModelTest, NonFiniteWeightsFailWithAMessage) {
  const size_t i = Index("layers.1.attention.wo.weight");
  for (size_t k = 6; k < data_[i].size(); k += 7) data_[i][k] = NAN;
  Rewrite();
  const std::string cmd =
      kGenerate + " --model " + dir_.path() + " --prompt-ids 1,2,3 --max-new-tokens 4 --json";
  auto r = testing::RunCommand(cmd);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.err.find("not finite (NaN or infinity)"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  r = testing::RunCommand(cmd + " --check-weights");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.err.find("tensor 'layers.1.attention.wo.weight' holds"), std::string::npos) << r.err;
}

// --score on a checkpoint with NaN in one wo fails INTERNAL naming the token (it printed
// {"mean_nll":null,"perplexity":null} and exit 0); the same model before the edit scores.
// A tokenizer.json of a byte-level BPE over "a".."z" (ids 0..25), no merges.
std::string AtoZTokenizer() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int c = 0; c < 26; ++c) vocab[std::string(1, static_cast<char>('a' + c))] = c;
  nlohmann::json tok;
  tok["version"] = "1.0";
  tok["added_tokens"] = nlohmann::json::array();
  tok["normalizer"] = nullptr;
  tok["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  tok["post_processor"] = nullptr;
  tok["decoder"] = {{"type", "ByteLevel"}};
  tok["model"] = {{"type", "BPE"},         {"dropout", nullptr},
                  {"unk_token", nullptr},  {"vocab", vocab},
                  {"merges", nlohmann::json::array()}};
  return tok.dump();
}

TEST_F(GenerateCorruptModelTest, ScoreOfNonFiniteLogitsFails) {
  // Ids 0..25, inside the model's 64.
  std::ofstream(dir_.File("tokenizer.json")) << AtoZTokenizer();
  std::ofstream(dir_.File("text.txt")) << "thequickbrownfoxjumpsoverthelazydog";
  const std::string cmd =
      kGenerate + " --model " + dir_.path() + " --score " + dir_.File("text.txt");
  auto r = testing::RunCommand(cmd);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j.at("predicted"), 34);
  EXPECT_TRUE(j.at("mean_nll").is_number_float() && std::isfinite(j.at("mean_nll").get<double>()))
      << r.out;

  const size_t i = Index("layers.1.attention.wo.weight");
  for (size_t k = 6; k < data_[i].size(); k += 7) data_[i][k] = NAN;
  Rewrite();
  r = testing::RunCommand(cmd);
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.err.find("INTERNAL: --score: the model's logits are not finite (NaN or infinity) "
                       "at token 0 of " + dir_.File("text.txt")),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

// --score takes a UTF-8 text file and --prompt UTF-8 text, as the server does (both were
// encoded byte by byte); a model of context 1 has nothing to score (it printed
// "perplexity": null with exit 0).
TEST(GenerateCliTest, ScoreAndPromptRefuseWhatTheyCannotMeasure) {
  testing::TempDir dir;
  const std::string model = dir.File("m");
  ASSERT_TRUE(
      WriteRandomModel(model, SmallDcFormerConfig(32, 1, 4, 48, 64, 1, 0), DType::kF32, 3).ok());
  std::ofstream(model + "/tokenizer.json") << AtoZTokenizer();
  std::ofstream(dir.File("bad.txt")) << "abc\xff\xfe"
                                        "def";
  std::ofstream(dir.File("good.txt")) << "thequickbrownfox";
  auto r = testing::RunCommand(kGenerate + " --model " + model + " --score " + dir.File("bad.txt"));
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.err.find("--score: " + dir.File("bad.txt") + " is not valid UTF-8 (byte 3)"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  r = testing::RunCommand(kGenerate + " --model " + model + " --score " + dir.File("good.txt"));
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.err.find("--score: the model context of 1 token cannot predict"), std::string::npos)
      << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  r = testing::RunCommand(kGenerate + " --model " + model +
                          " --prompt \"$(printf 'ab\\377c')\" --max-new-tokens 1");
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.err.find("--prompt is not valid UTF-8 (byte 2)"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

}  // namespace
}  // namespace dcf
