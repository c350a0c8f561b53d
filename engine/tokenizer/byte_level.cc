#include "engine/tokenizer/byte_level.h"

#include <array>

#include "engine/common/utf8.h"

namespace dcf {
namespace {

struct Tables {
  std::array<char32_t, 256> byte_to_char;
  std::array<int16_t, 0x144> char_to_byte;  // -1 where the character is not in the alphabet
};

// Mirrors bytes_to_unicode() of the GPT-2 reference encoder.
Tables BuildTables() {
  Tables t;
  t.char_to_byte.fill(-1);
  int next = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    const char32_t c = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next++);
    t.byte_to_char[b] = c;
    t.char_to_byte[c] = static_cast<int16_t>(b);
  }
  return t;
}

const Tables& GetTables() {
  static const Tables tables = BuildTables();
  return tables;
}

}  // namespace

char32_t ByteToByteLevelChar(uint8_t byte) { return GetTables().byte_to_char[byte]; }

void AppendByteLevel(std::string_view bytes, std::string* out) {
  const Tables& t = GetTables();
  for (char c : bytes) AppendUtf8(t.byte_to_char[static_cast<uint8_t>(c)], out);
}

std::optional<std::string> ByteLevelToBytes(std::string_view token) {
  const Tables& t = GetTables();
  std::string bytes;
  size_t i = 0;
  while (i < token.size()) {
    const Utf8Char c = DecodeUtf8At(token, i);
    if (c.status != Utf8Status::kValid || c.code_point >= t.char_to_byte.size() ||
        t.char_to_byte[c.code_point] < 0) {
      return std::nullopt;
    }
    bytes.push_back(static_cast<char>(t.char_to_byte[c.code_point]));
    i += c.length;
  }
  return bytes;
}

std::string ByteLevelDecodeToken(std::string_view token) {
  std::optional<std::string> bytes = ByteLevelToBytes(token);
  return bytes.has_value() ? *std::move(bytes) : std::string(token);
}

}  // namespace dcf
