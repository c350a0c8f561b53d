#include "engine/tokenizer/pretokenizer.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dcf {
namespace {

using ::testing::ElementsAre;

std::vector<std::string> Split(std::string_view text) {
  std::vector<std::string_view> pieces;
  SplitGpt2Pattern(text, &pieces);
  return std::vector<std::string>(pieces.begin(), pieces.end());
}

TEST(PreTokenizerTest, WordsNumbersPunctuation) {
  EXPECT_THAT(Split("Hello world"), ElementsAre("Hello", " world"));
  EXPECT_THAT(Split("abc123 456!?"), ElementsAre("abc", "123", " 456", "!?"));
  EXPECT_THAT(Split("a, b"), ElementsAre("a", ",", " b"));
  EXPECT_THAT(Split(" !x"), ElementsAre(" !", "x"));
}

TEST(PreTokenizerTest, Contractions) {
  EXPECT_THAT(Split("don't we'll I'd"), ElementsAre("don", "'t", " we", "'ll", " I", "'d"));
  // Case-sensitive like the reference pattern.
  EXPECT_THAT(Split("IT'S"), ElementsAre("IT", "'", "S"));
  EXPECT_THAT(Split("!'s"), ElementsAre("!'", "s"));
  EXPECT_THAT(Split("'"), ElementsAre("'"));
}

TEST(PreTokenizerTest, WhitespaceLookahead) {
  // \s+(?!\S) leaves the last space of a run to prefix the next word.
  EXPECT_THAT(Split("a   b"), ElementsAre("a", "  ", " b"));
  EXPECT_THAT(Split("a  "), ElementsAre("a", "  "));
  EXPECT_THAT(Split("a\n\nb"), ElementsAre("a", "\n", "\n", "b"));
  EXPECT_THAT(Split("a\nb"), ElementsAre("a", "\n", "b"));
  EXPECT_THAT(Split("a \n b"), ElementsAre("a", " \n", " b"));
  EXPECT_THAT(Split("   "), ElementsAre("   "));
  EXPECT_THAT(Split(" "), ElementsAre(" "));
}

TEST(PreTokenizerTest, UnicodeClasses) {
  // Combining acute (Mn) is not a letter: it splits off as "other".
  EXPECT_THAT(Split("e\xCC\x81t"), ElementsAre("e", "\xCC\x81", "t"));
  // CJK letters (Lo) form one word.
  EXPECT_THAT(Split("\xE4\xB8\x96\xE7\x95\x8C!"), ElementsAre("\xE4\xB8\x96\xE7\x95\x8C", "!"));
  // Arabic: "مرحبا بالعالم" -> word, space+word.
  EXPECT_THAT(Split("مرحبا بالعالم"), ElementsAre("مرحبا", " بالعالم"));
  // Hebrew.
  EXPECT_THAT(Split("שלום עולם"), ElementsAre("שלום", " עולם"));
  // Arabic-indic digits are \p{N}.
  EXPECT_THAT(Split("x ١٢٣"), ElementsAre("x", " ١٢٣"));
  // Emoji ZWJ sequence (So + Cf): one run of "other".
  EXPECT_THAT(Split(" 👨‍👩‍👧a"), ElementsAre(" 👨‍👩‍👧", "a"));
  // NBSP and ideographic space are \s, and only U+0020 is the optional prefix.
  EXPECT_THAT(Split("a\xC2\xA0"
                    "b"),
              ElementsAre("a", "\xC2\xA0", "b"));
  EXPECT_THAT(Split("a\xE3\x80\x80\xE3\x80\x80"
                    "b"),
              ElementsAre("a", "\xE3\x80\x80", "\xE3\x80\x80", "b"));
}

TEST(PreTokenizerTest, InvalidUtf8BytesAreOther) {
  EXPECT_THAT(Split("a\xFF\xFE"
                    "b"),
              ElementsAre("a", "\xFF\xFE", "b"));
  EXPECT_THAT(Split(" \xC3"), ElementsAre(" \xC3"));
}

TEST(PreTokenizerTest, ClassifyCodePoint) {
  EXPECT_EQ(ClassifyCodePoint(U'a'), CharClass::kLetter);
  EXPECT_EQ(ClassifyCodePoint(U'\u00BD'), CharClass::kNumber);  // No
  EXPECT_EQ(ClassifyCodePoint(U'\u2028'), CharClass::kSpace);
  EXPECT_EQ(ClassifyCodePoint(U'\u0085'), CharClass::kSpace);
  EXPECT_EQ(ClassifyCodePoint(U'_'), CharClass::kOther);
}

}  // namespace
}  // namespace dcf
