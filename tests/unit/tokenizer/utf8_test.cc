#include "engine/common/utf8.h"

#include <string>

#include "engine/tokenizer/byte_level.h"
#include "gtest/gtest.h"

namespace dcf {
namespace {

std::string Lossy(std::string_view bytes) {
  std::string out;
  EXPECT_EQ(AppendUtf8Lossy(bytes, &out, false), bytes.size());
  return out;
}

constexpr char kFffd[] = "\xEF\xBF\xBD";

TEST(Utf8Test, LossyMaximalSubparts) {
  EXPECT_EQ(Lossy("abc"), "abc");
  EXPECT_EQ(Lossy("\xE2\x82\xAC"), "\xE2\x82\xAC");
  // A truncated 3-byte sequence is one maximal subpart.
  EXPECT_EQ(Lossy("\xE2\x82"
                  "A"),
            std::string(kFffd) + "A");
  // Surrogates: ED A0 is not a valid start, so each byte is replaced.
  EXPECT_EQ(Lossy("\xED\xA0\x80"), std::string(kFffd) + kFffd + kFffd);
  // Overlong C0 80 -> two replacements; F5 is never valid.
  EXPECT_EQ(Lossy("\xC0\x80"), std::string(kFffd) + kFffd);
  EXPECT_EQ(Lossy("\xF5"), kFffd);
  EXPECT_EQ(Lossy("\xF0\x9F\x98"), kFffd);  // incomplete at the end: one replacement
}

TEST(Utf8Test, HoldIncompleteTail) {
  std::string out;
  EXPECT_EQ(AppendUtf8Lossy("ab\xF0\x9F", &out, true), 2u);
  EXPECT_EQ(out, "ab");
  out.clear();
  EXPECT_EQ(AppendUtf8Lossy("\xFF\xF0", &out, true), 1u);
  EXPECT_EQ(out, kFffd);
}

TEST(Utf8Test, Validation) {
  EXPECT_TRUE(IsValidUtf8("h\xC3\xA9llo \xF0\x9F\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("\xC3"));
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // > U+10FFFF
  EXPECT_EQ(FirstInvalidUtf8("h\xC3\xA9llo"), std::string_view::npos);
  EXPECT_EQ(FirstInvalidUtf8("Hello \xff\xfe"), 6u);
  EXPECT_EQ(FirstInvalidUtf8("ok\xC3"), 2u);  // a truncated character at the end
  EXPECT_EQ(FirstInvalidUtf8(""), std::string_view::npos);
}

TEST(ByteLevelTest, Gpt2Alphabet) {
  EXPECT_EQ(ByteToByteLevelChar(' '), U'\u0120');
  EXPECT_EQ(ByteToByteLevelChar('\n'), U'\u010A');
  EXPECT_EQ(ByteToByteLevelChar('A'), U'A');
  EXPECT_EQ(ByteToByteLevelChar(0xAD), U'\u0143');
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  std::string spelled;
  AppendByteLevel(all, &spelled);
  EXPECT_EQ(ByteLevelToBytes(spelled), all);
  EXPECT_EQ(ByteLevelToBytes("a b"), std::nullopt);  // ' ' is not in the alphabet
  EXPECT_EQ(ByteLevelDecodeToken("a b"), "a b");
}

}  // namespace
}  // namespace dcf
