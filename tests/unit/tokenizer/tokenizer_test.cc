#include "engine/tokenizer/tokenizer.h"

#include <time.h>

#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/tokenizer/test_util.h"

namespace dcf {
namespace {

double ThreadCpuSeconds() {
  timespec t = {};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

using ::dcf::testing_util::Gpt2;
using ::dcf::testing_util::Gpt2Dir;
using ::dcf::testing_util::LoadCasesFile;
using ::dcf::testing_util::LoadGpt2Cases;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

constexpr char kFffd[] = "\xEF\xBF\xBD";

std::vector<int32_t> Enc(const Tokenizer& tok, std::string_view text) {
  auto ids = tok.Encode(text);
  EXPECT_TRUE(ids.ok()) << ids.status();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

std::string Dec(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip = false) {
  auto text = tok.Decode(ids, skip);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

int32_t Id(const Tokenizer& tok, std::string_view token) {
  auto id = tok.TokenToId(token);
  EXPECT_TRUE(id.has_value()) << token;
  return id.value_or(-1);
}

TEST(TokenizerTest, Gpt2CasesMatchReferenceIds) {
  for (const auto& c : LoadGpt2Cases()) {
    EXPECT_THAT(Enc(Gpt2(), c.text), ElementsAreArray(c.ids)) << "text: " << c.text;
    if (c.roundtrip) {
      EXPECT_EQ(Dec(Gpt2(), c.ids), c.text);
    }
  }
}

// The tokenizer trained for models/dcformer-kjv (models/train/train_tokenizer.js) loads
// unchanged, and encodes the held-out chapters and edge cases exactly as the Hugging Face
// trainer that made it (the ids in tests/data/kjv/tokenizer_cases.jsonl come from it).
TEST(TokenizerTest, KjvTokenizerMatchesItsTrainer) {
  auto tok = Tokenizer::FromFile(std::string(DCF_SOURCE_DIR) + "/models/dcformer-kjv/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 4096);
  EXPECT_EQ((*tok)->eos_token_id(), 0);
  const auto cases = LoadCasesFile(std::string(DCF_TEST_DATA_DIR) + "/kjv/tokenizer_cases.jsonl");
  ASSERT_GE(cases.size(), 30u);
  size_t tokens = 0;
  for (const auto& c : cases) {
    const std::vector<int32_t> ids = Enc(**tok, c.text);
    EXPECT_EQ(ids, c.ids) << "text: " << c.text.substr(0, 80);
    EXPECT_EQ(Dec(**tok, c.ids), c.text);
    tokens += ids.size();
  }
  EXPECT_GT(tokens, 20000u);  // the held-out split, not just a few words
}

TEST(TokenizerTest, VocabMergesFormGivesSameIds) {
  auto vm = Tokenizer::FromVocabMerges(Gpt2Dir() + "/vocab.json", Gpt2Dir() + "/merges.txt");
  ASSERT_TRUE(vm.ok()) << vm.status();
  EXPECT_EQ((*vm)->vocab_size(), Gpt2().vocab_size());
  EXPECT_EQ((*vm)->eos_token_id(), 50256);
  for (const auto& c : LoadGpt2Cases()) {
    EXPECT_EQ(Enc(**vm, c.text), Enc(Gpt2(), c.text)) << c.text;
    EXPECT_THAT(Enc(**vm, c.text), ElementsAreArray(c.ids)) << c.text;
  }
}

TEST(TokenizerTest, FromModelDir) {
  auto tok = Tokenizer::FromModelDir(Gpt2Dir());
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT(Enc(**tok, "Hello world"), ElementsAre(15496, 995));
  auto missing = Tokenizer::FromModelDir(Gpt2Dir() + "/does-not-exist");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

// EncodeWithLimit is Encode within the budget, and refuses past it: on every prefix length
// around the text's own token count, and without encoding a huge single piece.
TEST(TokenizerTest, EncodeWithLimitAgreesWithEncodeAndStopsAtTheLimit) {
  const Tokenizer& tok = Gpt2();
  for (const std::string text : {"Hello world, how are you?", "<|endoftext|>a b<|endoftext|>",
                                 "   spaces\n\ttabs", ""}) {
    const std::vector<int32_t> ids = Enc(tok, text);
    auto exact = tok.EncodeWithLimit(text, ids.size());
    ASSERT_TRUE(exact.ok()) << exact.status();
    EXPECT_EQ(*exact, ids) << text;
    if (!ids.empty()) {
      auto over = tok.EncodeWithLimit(text, ids.size() - 1);
      EXPECT_EQ(over.status().code(), absl::StatusCode::kOutOfRange) << text;
      EXPECT_THAT(std::string(over.status().message()), ::testing::HasSubstr("more than"));
    }
  }
  // One 4 MiB "word": refused from its length alone (encoding it takes seconds of CPU). The
  // bound is on this thread's CPU time, which other processes on a loaded machine do not
  // stretch as they stretch the wall clock (refusing takes microseconds).
  const std::string word(4 << 20, 'a');
  const double cpu_before = ThreadCpuSeconds();
  EXPECT_EQ(tok.EncodeWithLimit(word, 1024).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_LT(ThreadCpuSeconds() - cpu_before, 0.5);
  // Within the budget a long word is still encoded exactly.
  const std::string short_word(300, 'a');
  auto ids = tok.EncodeWithLimit(short_word, 1024);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, Enc(tok, short_word));
}

TEST(TokenizerTest, VocabAccessors) {
  const Tokenizer& tok = Gpt2();
  EXPECT_EQ(tok.vocab_size(), 50257);
  EXPECT_EQ(tok.eos_token_id(), 50256);
  EXPECT_EQ(tok.TokenToId("<|endoftext|>"), 50256);
  EXPECT_EQ(tok.TokenToId("\xC4\xA0the"), 262);  // "Ġthe"
  EXPECT_EQ(tok.TokenToId("no such token"), std::nullopt);
  EXPECT_EQ(tok.IdToToken(995), "\xC4\xA0world");
  EXPECT_EQ(tok.IdToToken(-1), "");
  EXPECT_EQ(tok.IdToToken(50257), "");
  EXPECT_TRUE(tok.IsSpecial(50256));
  EXPECT_FALSE(tok.IsSpecial(262));
}

TEST(TokenizerTest, EndOfTextInsideText) {
  const Tokenizer& tok = Gpt2();
  std::vector<int32_t> expected = Enc(tok, "Hello");
  expected.push_back(50256);
  for (int32_t id : Enc(tok, " world")) expected.push_back(id);
  EXPECT_EQ(Enc(tok, "Hello<|endoftext|> world"), expected);
  EXPECT_THAT(Enc(tok, "<|endoftext|><|endoftext|>"), ElementsAre(50256, 50256));
  // A near miss is ordinary text.
  EXPECT_THAT(Enc(tok, "<|endoftext|"), ::testing::Not(::testing::Contains(50256)));
  EXPECT_EQ(Dec(tok, {15496, 50256, 995}), "Hello<|endoftext|> world");
  EXPECT_EQ(Dec(tok, {15496, 50256, 995}, /*skip=*/true), "Hello world");
}

TEST(TokenizerTest, UnicodeRoundTrips) {
  const Tokenizer& tok = Gpt2();
  const std::vector<std::string> texts = {
      "e\xCC\x81"
      "cole",                                          // combining acute accent
      "👨‍👩‍👧‍👦 and 🏳️‍🌈",  // emoji ZWJ sequences
      "漢字とかな交じり文、中文简体。",                // CJK
      "مرحبا بالعالم",                                 // Arabic (RTL)
      "שָׁלוֹם עוֹלָם",                                     // Hebrew with points
      "\xE2\x80\x8F"
      "rtl mark \xE2\x80\xAE override",
      "a\xC2\xA0"
      "b\xE3\x80\x80"
      "c\xE2\x80\xA8"
      "d",                              // Unicode spaces
      "\xF4\x8F\xBF\xBF \xEF\xBF\xBD",  // U+10FFFF and U+FFFD itself
      std::string("nul\0byte", 8),
  };
  for (const auto& text : texts) EXPECT_EQ(Dec(tok, Enc(tok, text)), text) << text;
}

TEST(TokenizerTest, CombiningMarkSplitsFromBaseLetter) {
  const Tokenizer& tok = Gpt2();
  // "é" decomposed: the mark (Mn) is its own piece, so ids = ids("e") + ids("\u0301").
  std::vector<int32_t> expected = Enc(tok, "e");
  for (int32_t id : Enc(tok, "\xCC\x81")) expected.push_back(id);
  EXPECT_EQ(Enc(tok, "e\xCC\x81"), expected);
  // Composed "é" is a letter and stays with its word: "caf" + "é" is one piece.
  EXPECT_EQ(Dec(tok, Enc(tok, "caf\xC3\xA9")), "caf\xC3\xA9");
}

TEST(TokenizerTest, InvalidUtf8IsEncodedAsRawBytes) {
  const Tokenizer& tok = Gpt2();
  // 0xFF is spelled "ÿ" (U+00FF) in the byte-level alphabet.
  EXPECT_THAT(Enc(tok,
                  "a\xFF"
                  "b"),
              ElementsAre(64, Id(tok, "\xC3\xBF"), 65));
  for (const std::string text : {"a\xFF"
                                 "b",
                                 "\xE2\x82", "x\xED\xA0\x80y", "\xC0\xAF!"}) {
    const std::vector<int32_t> ids = Enc(tok, text);
    std::string bytes;
    for (int32_t id : ids) bytes.append(*tok.TokenBytes(id));
    EXPECT_EQ(bytes, text);  // byte-exact at the token level
  }
  // Text decoding replaces each maximal ill-formed subsequence with U+FFFD.
  EXPECT_EQ(Dec(tok, Enc(tok,
                         "a\xFF"
                         "b")),
            std::string("a") + kFffd + "b");
  EXPECT_EQ(Dec(tok, Enc(tok,
                         "\xE2\x82"
                         "A")),
            std::string(kFffd) + "A");
}

TEST(TokenizerTest, DecodeUnknownIdIsInvalidArgument) {
  EXPECT_EQ(Gpt2().Decode({15496, 50257}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Gpt2().Decode({-1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Dec(Gpt2(), {}), "");
  EXPECT_THAT(Enc(Gpt2(), ""), ElementsAre());
}

TEST(TokenizerTest, DecodeSingleBytesOfMultiByteChar) {
  const Tokenizer& tok = Gpt2();
  // "€" = E2 82 AC, i.e. byte-level chars "â", "Ĥ", "¬".
  const std::vector<int32_t> ids = {Id(tok, "\xC3\xA2"), Id(tok, "\xC4\xA4"), Id(tok, "\xC2\xAC")};
  EXPECT_EQ(Dec(tok, ids), "\xE2\x82\xAC");
  EXPECT_EQ(Dec(tok, {ids[0], ids[1]}), kFffd);
  EXPECT_EQ(Dec(tok, {ids[0], 64}), std::string(kFffd) + "a");
}

TEST(TokenizerTest, LongWordsAndConcurrentUse) {
  const Tokenizer& tok = Gpt2();
  std::string long_word(20000, 'a');
  long_word += "bc";
  const std::vector<int32_t> ids = Enc(tok, long_word);
  EXPECT_EQ(Dec(tok, ids), long_word);
  const auto cases = LoadGpt2Cases();
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 50; ++round) {
        for (const auto& c : cases) {
          auto got = tok.Encode(c.text);
          if (!got.ok() || *got != c.ids) ++failures[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_THAT(failures, ElementsAre(0, 0, 0, 0));
}

}  // namespace
}  // namespace dcf
