// Loading of tokenizer.json variants written by the test itself: supported flags and the
// InvalidArgument / NotFound errors for everything else.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace dcf {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

std::string Spell(std::string_view bytes) {
  std::string s;
  AppendByteLevel(bytes, &s);
  return s;
}

// Every byte b has id b; "ab" = 256, "Ġa" = 257, "Ġab" = 258. Merge ranks: "Ġ a", "a b",
// "Ġa b" (so " ab" becomes "Ġab", and merge order matters: see RankOrderMatters).
Json TinyTokenizer() {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[Spell(std::string(1, static_cast<char>(b)))] = b;
  vocab["ab"] = 256;
  vocab[Spell(" a")] = 257;
  vocab[Spell(" ab")] = 258;
  Json j;
  j["version"] = "1.0";
  j["added_tokens"] = Json::array();
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  j["post_processor"] = nullptr;
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"vocab", vocab},
                {"merges", Json::array({Spell(" ") + " a", "a b", Spell(" a") + " b"})}};
  return j;
}

Json Added(int id, const std::string& content, bool lstrip = false, bool rstrip = false,
           bool single_word = false, bool special = true) {
  return {{"id", id},          {"content", content}, {"single_word", single_word},
          {"lstrip", lstrip},  {"rstrip", rstrip},   {"normalized", false},
          {"special", special}};
}

class TokenizerConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("dcf_tok_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const Json& j) {
    return Tokenizer::FromFile(Write("tokenizer.json", j.dump()));
  }
  std::vector<int32_t> Enc(const Json& j, std::string_view text) {
    auto tok = Load(j);
    EXPECT_TRUE(tok.ok()) << tok.status();
    if (!tok.ok()) return {};
    auto ids = (*tok)->Encode(text);
    EXPECT_TRUE(ids.ok());
    return *ids;
  }
  void ExpectInvalid(const Json& j, std::string_view field) {
    auto tok = Load(j);
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument) << tok.status();
    EXPECT_THAT(std::string(tok.status().message()), HasSubstr(field));
  }

  std::filesystem::path dir_;
};

TEST_F(TokenizerConfigTest, TinyModelMerges) {
  EXPECT_THAT(Enc(TinyTokenizer(), "ab ab a"), ElementsAre(256, 258, 257));
  Json pairs = TinyTokenizer();
  pairs["model"]["merges"] = Json::array(
      {Json::array({Spell(" "), "a"}), Json::array({"a", "b"}), Json::array({Spell(" a"), "b"})});
  EXPECT_THAT(Enc(pairs, "ab ab a"), ElementsAre(256, 258, 257));
}

TEST_F(TokenizerConfigTest, RankOrderMatters) {
  // With "a b" ranked first, " ab" becomes "Ġ" + "ab" and "Ġab" is never reached.
  Json j = TinyTokenizer();
  j["model"]["merges"] = Json::array({"a b", Spell(" ") + " a", Spell(" a") + " b"});
  EXPECT_THAT(Enc(j, " ab"), ElementsAre(' ', 256));
  EXPECT_THAT(Enc(j, " a"), ElementsAre(257));
}

TEST_F(TokenizerConfigTest, AddPrefixSpaceAndUseRegex) {
  Json j = TinyTokenizer();
  j["pre_tokenizer"]["add_prefix_space"] = true;
  EXPECT_THAT(Enc(j, "ab"), ElementsAre(258));
  EXPECT_THAT(Enc(j, " ab"), ElementsAre(258));  // no second space
  Json nr = TinyTokenizer();
  nr["pre_tokenizer"]["use_regex"] = false;
  // Without the split, "a," stays one word; with it "a" "," split: ids are the same bytes here,
  // but " ab!" must not break the " ab" merge either way.
  EXPECT_THAT(Enc(nr, "x ab!"), ElementsAre('x', 258, '!'));
  EXPECT_THAT(Enc(TinyTokenizer(), "a\nab"), ElementsAre('a', '\n', 256));
}

TEST_F(TokenizerConfigTest, AddedTokenFlags) {
  Json j = TinyTokenizer();
  j["added_tokens"] = Json::array({Added(259, "<m>"), Added(260, "<l>", /*lstrip=*/true),
                                   Added(261, "<r>", false, /*rstrip=*/true),
                                   Added(262, "<w>", false, false, /*single_word=*/true),
                                   Added(263, "<m>x", false, false, false, /*special=*/false)});
  EXPECT_THAT(Enc(j, "x <m>"), ElementsAre('x', ' ', 259));
  EXPECT_THAT(Enc(j, "x  <l> y"), ElementsAre('x', 260, ' ', 'y'));
  EXPECT_THAT(Enc(j, "x <r>  y"), ElementsAre('x', ' ', 261, 'y'));
  EXPECT_THAT(Enc(j, "a <w> b"), ElementsAre('a', ' ', 262, ' ', 'b'));
  EXPECT_THAT(Enc(j, "a<w>"), ElementsAre('a', '<', 'w', '>'));  // touches a word: no match
  EXPECT_THAT(Enc(j, "<m>x<m>"), ElementsAre(263, 259));         // longest match first
  auto tok = Load(j);
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ(*(*tok)->Decode({259, 'a', 263}, /*skip_special_tokens=*/true), "a<m>x");
  EXPECT_EQ((*tok)->vocab_size(), 264);
  EXPECT_EQ((*tok)->Decode({264}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(TokenizerConfigTest, NfcNormalizer) {
  Json j = TinyTokenizer();
  j["normalizer"] = {{"type", "NFC"}};
  // "e" + U+0301 composes to U+00E9 (bytes C3 A9).
  EXPECT_THAT(Enc(j, "e\xCC\x81"), ElementsAre(0xC3, 0xA9));
  EXPECT_THAT(Enc(TinyTokenizer(), "e\xCC\x81"), ElementsAre('e', 0xCC, 0x81));
  EXPECT_THAT(Enc(j,
                  "\xFF"
                  "e\xCC\x81"),
              ElementsAre(0xFF, 0xC3, 0xA9));
}

TEST_F(TokenizerConfigTest, SequenceOfByteLevelAccepted) {
  Json j = TinyTokenizer();
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers", Json::array({{{"type", "ByteLevel"}, {"add_prefix_space", false}}})}};
  EXPECT_THAT(Enc(j, "ab"), ElementsAre(256));
}

TEST_F(TokenizerConfigTest, MissingFileIsNotFound) {
  auto tok = Tokenizer::FromFile((dir_ / "nope.json").string());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound);
  auto vm = Tokenizer::FromVocabMerges((dir_ / "v.json").string(), (dir_ / "m.txt").string());
  EXPECT_EQ(vm.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Tokenizer::FromModelDir(dir_.string()).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(TokenizerConfigTest, MalformedJson) {
  auto tok = Tokenizer::FromFile(Write("bad.json", "{\"model\": {"));
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(tok.status().message()), HasSubstr("not valid JSON"));
  auto vm = Tokenizer::FromVocabMerges(Write("v.json", "[1,"), Write("m.txt", "a b\n"));
  EXPECT_EQ(vm.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(TokenizerConfigTest, UnsupportedComponentsNameTheField) {
  Json j = TinyTokenizer();
  j["model"]["type"] = "WordPiece";
  ExpectInvalid(j, "model.type");
  j = TinyTokenizer();
  j["model"]["dropout"] = 0.1;
  ExpectInvalid(j, "model.dropout");
  j = TinyTokenizer();
  j["model"]["byte_fallback"] = true;
  ExpectInvalid(j, "model.byte_fallback");
  j = TinyTokenizer();
  j["model"]["continuing_subword_prefix"] = "##";
  ExpectInvalid(j, "model.continuing_subword_prefix");
  j = TinyTokenizer();
  j["normalizer"] = {{"type", "Lowercase"}};
  ExpectInvalid(j, "normalizer.type");
  j = TinyTokenizer();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  ExpectInvalid(j, "pre_tokenizer.type");
  j = TinyTokenizer();
  j["pre_tokenizer"] = nullptr;
  ExpectInvalid(j, "pre_tokenizer");
  j = TinyTokenizer();
  j["decoder"] = {{"type", "WordPiece"}};
  ExpectInvalid(j, "decoder.type");
  j = TinyTokenizer();
  j["post_processor"] = {{"type", "TemplateProcessing"}};
  ExpectInvalid(j, "post_processor.type");
  j = TinyTokenizer();
  j["model"]["merges"] = Json::array({"a b c"});
  ExpectInvalid(j, "model.merges[0]");
  j = TinyTokenizer();
  j["model"]["merges"] = Json::array({"a zz"});
  ExpectInvalid(j, "model.merges[0]");
  j = TinyTokenizer();
  j["model"]["vocab"]["x"] = "seven";
  ExpectInvalid(j, "model.vocab");
  j = TinyTokenizer();
  j["added_tokens"] = Json::array({{{"content", "<x>"}}});
  ExpectInvalid(j, "added_tokens[0]");
}

TEST_F(TokenizerConfigTest, VocabMergesForm) {
  Json vocab = TinyTokenizer()["model"]["vocab"];
  vocab["<|endoftext|>"] = 259;
  const std::string merges = "#version: 0.2\n" + Spell(" ") + " a\na b\n" + Spell(" a") + " b\n";
  auto tok =
      Tokenizer::FromVocabMerges(Write("vocab.json", vocab.dump()), Write("merges.txt", merges));
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_THAT(*(*tok)->Encode("ab ab<|endoftext|>"), ElementsAre(256, 258, 259));
  EXPECT_EQ((*tok)->eos_token_id(), 259);
  EXPECT_TRUE((*tok)->IsSpecial(259));
  auto dir_tok = Tokenizer::FromModelDir(dir_.string());
  ASSERT_TRUE(dir_tok.ok()) << dir_tok.status();
  EXPECT_THAT(*(*dir_tok)->Encode("ab"), ElementsAre(256));
}


// One enormous id in a tiny file must not make the loader allocate gigabytes.
TEST_F(TokenizerConfigTest, SparseHugeIdIsRejected) {
  Json j = TinyTokenizer();
  j["model"]["vocab"]["zz"] = 2000000000;
  ExpectInvalid(j, "ids must be dense");
  Json added = TinyTokenizer();
  added["added_tokens"] = Json::array({Added(1 << 30, "<|big|>")});
  ExpectInvalid(added, "ids must be dense");
}

// Every id from 0 to the largest names exactly one token: a hole or an id shared by two
// strings would give a token the model can produce no defined text.
TEST_F(TokenizerConfigTest, IdsMustBeDenseAndUnique) {
  Json hole = TinyTokenizer();  // ids 0..258, then 300: 259..299 name nothing
  hole["added_tokens"] = Json::array({Added(300, "<|pad|>")});
  ExpectInvalid(hole, "no token has id 259, below the largest id 300");
  Json vocab_hole = TinyTokenizer();
  vocab_hole["model"]["vocab"].erase("ab");
  vocab_hole["model"]["merges"] = Json::array({Spell(" ") + " a"});
  ExpectInvalid(vocab_hole, "no token has id 256, below the largest id 258");
  Json shared = TinyTokenizer();
  shared["model"]["vocab"]["zz"] = 257;
  ExpectInvalid(shared, "model.vocab gives id 257 to both");
  Json added_clash = TinyTokenizer();  // id 256 is "ab" in the vocabulary
  added_clash["added_tokens"] = Json::array({Added(256, "<|x|>")});
  ExpectInvalid(added_clash, "added_tokens[0] gives id 256 to \"<|x|>\", which already names");
  Json added_twice = TinyTokenizer();
  added_twice["added_tokens"] = Json::array({Added(259, "<a>"), Added(259, "<b>")});
  ExpectInvalid(added_twice, "added_tokens[1] gives id 259");
  // The same string declared in both places (GPT-2's <|endoftext|>) and a dense tail are fine.
  Json ok = TinyTokenizer();
  ok["model"]["vocab"]["<|endoftext|>"] = 259;
  ok["added_tokens"] = Json::array({Added(259, "<|endoftext|>"), Added(260, "<|pad|>")});
  auto tok = Load(ok);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 261);
}

}  // namespace
}  // namespace dcf
