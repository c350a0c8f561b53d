// The output processor without a model: stop token ids, EOS, length and stop strings across
// token boundaries, with several tokens per call (the stop falling inside the run), and the
// same results whether tokens arrive one at a time or many at once.
#include "engine/serving/output_processor.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/tiny_tokenizer.h"

namespace dcf {
namespace {

constexpr int32_t kEos = 299;
constexpr int kContext = 256;

std::vector<TokenOutput> Tokens(const std::vector<int32_t>& ids) {
  std::vector<TokenOutput> out;
  for (int32_t id : ids) {
    TokenOutput t;
    t.token = id;
    t.logprob = -0.5f * static_cast<float>(id % 7);
    out.push_back(t);
  }
  return out;
}

std::vector<int32_t> Ids(const std::string& text) {  // single-byte tokens
  std::vector<int32_t> ids;
  for (char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

std::vector<int32_t> ChunkIds(const GenerationChunk& c) {
  std::vector<int32_t> ids;
  for (const TokenOutput& t : c.tokens) ids.push_back(t.token);
  return ids;
}

class OutputProcessorTest : public ::testing::Test {
 protected:
  OutputProcessor Make(int prompt_len = 5, bool with_eos = true) {
    return OutputProcessor(stopping_, output_, with_eos ? std::optional<int32_t>(kEos)
                                                        : std::nullopt,
                           tokenizer_.get(), prompt_len, kContext);
  }

  std::unique_ptr<Tokenizer> tokenizer_ = testing::TinyTokenizer();
  StoppingCriteria stopping_;
  OutputOptions output_;
};

TEST_F(OutputProcessorTest, StopTokenInsideARunCutsThere) {
  stopping_.max_new_tokens = 100;
  stopping_.stop_token_ids = {7, 9};
  output_.text = false;
  OutputProcessor p = Make();
  GenerationChunk chunk;
  const auto u = p.Process(Tokens({1, 2, 9, 3, 4}), &chunk);
  EXPECT_EQ(u.accepted, 3);
  EXPECT_EQ(u.reason, FinishReason::kStopToken);
  EXPECT_EQ(ChunkIds(chunk), (std::vector<int32_t>{1, 2, 9}));  // the stop token is emitted
  EXPECT_EQ(chunk.tokens[2].logprob, Tokens({9})[0].logprob);
  p.Finish(u.reason, absl::OkStatus(), &chunk);
  EXPECT_TRUE(chunk.finished);
  EXPECT_EQ(chunk.finish_reason, FinishReason::kStopToken);
  EXPECT_EQ(chunk.usage.prompt_tokens, 5);
  EXPECT_EQ(chunk.usage.generated_tokens, 3);  // the dropped tokens are not counted
  EXPECT_EQ(p.num_generated(), 3);
}

TEST_F(OutputProcessorTest, EosInsideARunUnlessIgnoredOrOverridden) {
  stopping_.max_new_tokens = 100;
  output_.text = false;
  {
    OutputProcessor p = Make();
    GenerationChunk chunk;
    const auto u = p.Process(Tokens({1, kEos, 2}), &chunk);
    EXPECT_EQ(u.accepted, 2);
    EXPECT_EQ(u.reason, FinishReason::kEos);
  }
  {  // no EOS known: the id is an ordinary token
    OutputProcessor p = Make(5, /*with_eos=*/false);
    GenerationChunk chunk;
    const auto u = p.Process(Tokens({1, kEos, 2}), &chunk);
    EXPECT_EQ(u.accepted, 3);
    EXPECT_EQ(u.reason, FinishReason::kUnspecified);
  }
  {  // the request's EOS replaces the engine's
    stopping_.eos_token_id = 2;
    OutputProcessor p = Make();
    GenerationChunk chunk;
    const auto u = p.Process(Tokens({1, kEos, 3, 2, 4}), &chunk);
    EXPECT_EQ(u.accepted, 4);
    EXPECT_EQ(u.reason, FinishReason::kEos);
  }
  {  // ignore_eos: neither stops
    stopping_.ignore_eos = true;
    OutputProcessor p = Make();
    GenerationChunk chunk;
    const auto u = p.Process(Tokens({1, kEos, 2, 3}), &chunk);
    EXPECT_EQ(u.accepted, 4);
    EXPECT_EQ(u.reason, FinishReason::kUnspecified);
  }
}

TEST_F(OutputProcessorTest, LengthInsideARun) {
  stopping_.max_new_tokens = 4;
  output_.text = false;
  OutputProcessor p = Make();
  GenerationChunk first;
  auto u = p.Process(Tokens({1, 2}), &first);
  EXPECT_EQ(u.accepted, 2);
  EXPECT_EQ(u.reason, FinishReason::kUnspecified);
  GenerationChunk second;
  u = p.Process(Tokens({3, 4, 5, 6}), &second);
  EXPECT_EQ(u.accepted, 2);
  EXPECT_EQ(u.reason, FinishReason::kLength);
  EXPECT_EQ(ChunkIds(second), (std::vector<int32_t>{3, 4}));
  p.Finish(u.reason, absl::OkStatus(), &second);
  EXPECT_EQ(second.usage.generated_tokens, 4);
}

// The last token needs a position to be fed back: a sequence ends once prompt + generated
// exceeds the context (the last sampled token is at position `context`).
TEST_F(OutputProcessorTest, ContextLimit) {
  stopping_.max_new_tokens = 100;
  output_.text = false;
  OutputProcessor p = Make(/*prompt_len=*/kContext - 3);
  GenerationChunk chunk;
  const auto u = p.Process(Tokens({1, 2, 3, 4, 5, 6}), &chunk);
  EXPECT_EQ(u.accepted, 4);
  EXPECT_EQ(u.reason, FinishReason::kLength);
}

TEST_F(OutputProcessorTest, StopStringAcrossTokensInsideARun) {
  stopping_.max_new_tokens = 100;
  stopping_.stop_strings = {"cde", "never"};
  for (bool include : {false, true}) {
    stopping_.include_stop_string = include;
    OutputProcessor p = Make();
    GenerationChunk chunk;
    // "ab" | "c" | "d" | "ef" ...: the match completes on the token "e" (its fourth byte).
    const auto u = p.Process(Tokens(Ids("abcdefgh")), &chunk);
    EXPECT_EQ(u.reason, FinishReason::kStopString);
    EXPECT_EQ(u.accepted, 5);
    EXPECT_EQ(ChunkIds(chunk), Ids("abcde"));
    p.Finish(u.reason, absl::OkStatus(), &chunk);
    EXPECT_EQ(chunk.text, include ? "abcde" : "ab");
    EXPECT_EQ(chunk.usage.generated_tokens, 5);
  }
}

TEST_F(OutputProcessorTest, StopStringsMatchWithoutReturningText) {
  stopping_.max_new_tokens = 100;
  stopping_.stop_strings = {"xy"};
  output_.text = false;
  OutputProcessor p = Make();
  GenerationChunk chunk;
  const auto u = p.Process(Tokens(Ids("abxyz")), &chunk);
  EXPECT_EQ(u.reason, FinishReason::kStopString);
  EXPECT_EQ(u.accepted, 4);
  p.Finish(u.reason, absl::OkStatus(), &chunk);
  EXPECT_TRUE(chunk.text.empty());
}

// Text that could start a stop string is held back, and released when the request ends for
// another reason (here: cancelled); a partial UTF-8 character becomes U+FFFD at the end.
TEST_F(OutputProcessorTest, HeldBackTextIsReleasedAtTheEnd) {
  stopping_.max_new_tokens = 100;
  stopping_.stop_strings = {"xyz"};
  OutputProcessor p = Make();
  GenerationChunk chunk;
  auto u = p.Process(Tokens(Ids("abxy")), &chunk);
  EXPECT_EQ(u.reason, FinishReason::kUnspecified);
  EXPECT_EQ(chunk.text, "ab");
  GenerationChunk more;
  u = p.Process(Tokens({0xc3}), &more);  // the first byte of "é"
  EXPECT_EQ(more.text, "");
  GenerationChunk last;
  p.Finish(FinishReason::kCancelled, absl::OkStatus(), &last);
  EXPECT_EQ(last.text, "xy\xEF\xBF\xBD");
  EXPECT_EQ(last.finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(last.usage.generated_tokens, 5);
  EXPECT_TRUE(last.tokens.empty());
}

TEST_F(OutputProcessorTest, IdsWithoutATokenHaveNoText) {
  auto bytes_only = [] {
    TokenizerSpec spec;
    for (int b = 0; b < 256; ++b) {
      std::string t;
      AppendByteLevel(std::string(1, static_cast<char>(b)), &t);
      spec.vocab[t] = b;
    }
    return *Tokenizer::FromSpec(std::move(spec));
  }();
  stopping_.max_new_tokens = 100;
  OutputProcessor p(stopping_, output_, std::nullopt, bytes_only.get(), 5, kContext);
  GenerationChunk chunk;
  const auto u = p.Process(Tokens({'h', 280, 'i'}), &chunk);
  EXPECT_EQ(u.accepted, 3);
  EXPECT_EQ(u.reason, FinishReason::kUnspecified);
  EXPECT_EQ(chunk.text, "hi");
}

// Property: however a token sequence is split into Process calls (one per call, all at
// once, random runs), the emitted tokens, the text, the reason and the usage are the same.
TEST_F(OutputProcessorTest, SplittingTheTokensChangesNothing) {
  std::mt19937 rng(7);
  const std::vector<std::string> stops = {"ab", "ba", "zz", "aAb", "q"};
  int stopped_inside_a_run = 0;
  for (int trial = 0; trial < 300; ++trial) {
    stopping_ = StoppingCriteria();
    stopping_.max_new_tokens = 1 + static_cast<int>(rng() % 40);
    stopping_.ignore_eos = rng() % 4 == 0;
    if (rng() % 2) stopping_.stop_token_ids = {static_cast<int32_t>('a' + rng() % 26)};
    if (rng() % 2) stopping_.stop_strings = {stops[rng() % stops.size()]};
    stopping_.include_stop_string = rng() % 2;
    output_.text = rng() % 3 != 0;
    std::vector<int32_t> ids;
    for (int i = 0; i < 50; ++i) {
      const int kind = static_cast<int>(rng() % 20);
      ids.push_back(kind == 0 ? kEos : kind < 4 ? 256 + static_cast<int32_t>(rng() % 43)
                                              : 'a' + static_cast<int32_t>(rng() % 26));
    }
    const int prompt_len = kContext - 60 + static_cast<int>(rng() % 40);

    struct Result {
      std::vector<int32_t> ids;
      std::string text;
      FinishReason reason = FinishReason::kUnspecified;
      int generated = 0;
    };
    auto run = [&](const std::vector<int>& splits) {
      OutputProcessor p = Make(prompt_len);
      Result r;
      GenerationChunk all;
      size_t at = 0;
      for (int n : splits) {
        if (at >= ids.size()) break;
        const size_t len = std::min<size_t>(n, ids.size() - at);
        GenerationChunk c;
        const auto u = p.Process(Tokens({ids.begin() + at, ids.begin() + at + len}), &c);
        EXPECT_LE(u.accepted, static_cast<int>(len));
        all.tokens.insert(all.tokens.end(), c.tokens.begin(), c.tokens.end());
        all.text += c.text;
        at += len;
        if (u.reason != FinishReason::kUnspecified) {
          if (u.accepted < static_cast<int>(len)) ++stopped_inside_a_run;
          r.reason = u.reason;
          break;
        }
      }
      GenerationChunk last;
      p.Finish(r.reason == FinishReason::kUnspecified ? FinishReason::kLength : r.reason,
               absl::OkStatus(), &last);
      r.ids = ChunkIds(all);
      r.text = all.text + last.text;
      r.generated = last.usage.generated_tokens;
      return r;
    };
    const Result one = run(std::vector<int>(ids.size(), 1));
    const Result whole = run({static_cast<int>(ids.size())});
    std::vector<int> random_runs;
    for (size_t n = 0; n < ids.size(); n += random_runs.back()) {
      random_runs.push_back(1 + static_cast<int>(rng() % 6));
    }
    const Result mixed = run(random_runs);
    for (const Result* r : {&whole, &mixed}) {
      EXPECT_EQ(r->ids, one.ids) << "trial " << trial;
      EXPECT_EQ(r->text, one.text) << "trial " << trial;
      EXPECT_EQ(r->reason, one.reason) << "trial " << trial;
      EXPECT_EQ(r->generated, one.generated) << "trial " << trial;
    }
    EXPECT_EQ(one.generated, static_cast<int>(one.ids.size()));
  }
  EXPECT_GT(stopped_inside_a_run, 100);  // most trials exercised a cut inside a run
}

}  // namespace
}  // namespace dcf
