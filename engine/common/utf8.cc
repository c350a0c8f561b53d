#include "engine/common/utf8.h"

#include <cstdint>

namespace dcf {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

Utf8Char DecodeUtf8At(std::string_view text, size_t pos) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  const uint8_t b0 = s[pos];
  if (b0 < 0x80) return {Utf8Status::kValid, 1, b0};
  // Table 3-7 of the Unicode standard: the allowed range of the second byte depends on the lead.
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;
  char32_t cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {Utf8Status::kInvalid, 1, 0};
  }
  for (size_t k = 1; k <= need; ++k) {
    if (pos + k >= n) return {Utf8Status::kIncomplete, n - pos, 0};
    const uint8_t b = s[pos + k];
    if (b < lo || b > hi) return {Utf8Status::kInvalid, k, 0};
    lo = 0x80;
    hi = 0xBF;
    cp = (cp << 6) | (b & 0x3F);
  }
  return {Utf8Status::kValid, need + 1, cp};
}

bool IsValidUtf8(std::string_view text) { return FirstInvalidUtf8(text) == std::string_view::npos; }

size_t FirstInvalidUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    if (static_cast<uint8_t>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const Utf8Char c = DecodeUtf8At(text, i);
    if (c.status != Utf8Status::kValid) return i;
    i += c.length;
  }
  return std::string_view::npos;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t AppendUtf8Lossy(std::string_view bytes, std::string* out, bool hold_incomplete_tail) {
  size_t i = 0;
  size_t run_start = 0;  // start of the pending run of valid bytes, copied in one append
  while (i < bytes.size()) {
    if (static_cast<uint8_t>(bytes[i]) < 0x80) {
      ++i;
      continue;
    }
    const Utf8Char c = DecodeUtf8At(bytes, i);
    if (c.status == Utf8Status::kValid) {
      i += c.length;
      continue;
    }
    out->append(bytes.data() + run_start, i - run_start);
    if (c.status == Utf8Status::kIncomplete && hold_incomplete_tail) return i;
    out->append(kReplacement);
    i += c.length;
    run_start = i;
  }
  out->append(bytes.data() + run_start, i - run_start);
  return i;
}

}  // namespace dcf
