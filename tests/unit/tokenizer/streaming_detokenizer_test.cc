#include "engine/tokenizer/streaming_detokenizer.h"

#include <random>
#include <string>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "engine/common/utf8.h"
#include "gtest/gtest.h"
#include "tests/unit/tokenizer/test_util.h"

namespace dcf {
namespace {

using ::dcf::testing_util::Gpt2;
using ::dcf::testing_util::LoadGpt2Cases;

// Streams `ids` one at a time; checks every piece is valid UTF-8 and returns the concatenation.
std::string Stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip = false) {
  StreamingDetokenizer detok(tok, skip);
  std::string all;
  for (int32_t id : ids) {
    auto piece = detok.Push(id);
    EXPECT_TRUE(piece.ok()) << piece.status();
    if (!piece.ok()) continue;
    EXPECT_TRUE(IsValidUtf8(*piece)) << "id " << id;
    all += *piece;
  }
  const std::string tail = detok.Finish();
  EXPECT_TRUE(IsValidUtf8(tail));
  return all + tail;
}

TEST(StreamingDetokenizerTest, MatchesWholeDecodeOnCases) {
  for (const auto& c : LoadGpt2Cases()) {
    EXPECT_EQ(Stream(Gpt2(), c.ids), *Gpt2().Decode(c.ids)) << c.text;
    if (c.roundtrip) {
      EXPECT_EQ(Stream(Gpt2(), c.ids), c.text);
    }
  }
}

TEST(StreamingDetokenizerTest, HoldsBackSplitCharacter) {
  const Tokenizer& tok = Gpt2();
  // "😀" = F0 9F 98 80, fed as its four single-byte tokens ("ð", "Ł", "ĺ", "Ģ") so that the
  // hold-back path is exercised byte by byte.
  const std::vector<int32_t> ids = {*tok.TokenToId("\xC3\xB0"), *tok.TokenToId("\xC5\x81"),
                                    *tok.TokenToId("\xC4\xBA"), *tok.TokenToId("\xC4\xA2")};
  ASSERT_EQ(*tok.Decode(ids), "\xF0\x9F\x98\x80");
  StreamingDetokenizer detok(tok);
  EXPECT_EQ(*detok.Push(64), "a");
  EXPECT_EQ(*detok.Push(ids[0]), "");
  EXPECT_EQ(*detok.Push(ids[1]), "");
  EXPECT_EQ(*detok.Push(ids[2]), "");
  EXPECT_EQ(*detok.Push(ids[3]), "\xF0\x9F\x98\x80");
  EXPECT_EQ(detok.Finish(), "");
  // Incomplete at the end: Finish flushes one U+FFFD, like Decode.
  EXPECT_EQ(*detok.Push(ids[0]), "");
  EXPECT_EQ(*detok.Push(ids[1]), "");
  EXPECT_EQ(detok.Finish(), "\xEF\xBF\xBD");
  // An invalid continuation releases the replacement right away.
  EXPECT_EQ(*detok.Push(ids[0]), "");
  EXPECT_EQ(*detok.Push(64),
            "\xEF\xBF\xBD"
            "a");
  EXPECT_EQ(detok.Finish(), "");
}

TEST(StreamingDetokenizerTest, EmojiCaseSplitAcrossTokens) {
  const Tokenizer& tok = Gpt2();
  const std::vector<int32_t> ids = *tok.Encode("👍🏽 ok");
  StreamingDetokenizer detok(tok);
  std::vector<std::string> pieces;
  for (int32_t id : ids) pieces.push_back(*detok.Push(id));
  EXPECT_EQ(pieces.front(), "");  // first token is an incomplete 4-byte sequence
  std::string joined;
  for (const auto& p : pieces) joined += p;
  EXPECT_EQ(joined + detok.Finish(), "👍🏽 ok");
}

TEST(StreamingDetokenizerTest, UnknownIdAndSkipSpecial) {
  StreamingDetokenizer detok(Gpt2());
  EXPECT_EQ(detok.Push(50257).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Stream(Gpt2(), {15496, 50256, 995}, /*skip=*/true), "Hello world");
  EXPECT_EQ(Stream(Gpt2(), {15496, 50256, 995}), "Hello<|endoftext|> world");
}

TEST(StreamingDetokenizerTest, RandomIdSequencesMatchDecode) {
  const Tokenizer& tok = Gpt2();
  std::mt19937 rng(1234);
  // Bias towards byte tokens (ids < 256 and the single-byte ones above) to hit partial chars.
  std::uniform_int_distribution<int32_t> any(0, tok.vocab_size() - 1);
  std::uniform_int_distribution<int32_t> low(0, 255);
  for (int round = 0; round < 500; ++round) {
    std::vector<int32_t> ids(1 + rng() % 12);
    for (auto& id : ids) id = (rng() % 2) ? low(rng) : any(rng);
    for (auto& id : ids) {
      if (rng() % 3 == 0) id = *tok.TokenToId("\xC3\xA2");  // "â": the lead byte 0xE2
    }
    EXPECT_EQ(Stream(tok, ids), *tok.Decode(ids));
  }
}

}  // namespace
}  // namespace dcf
