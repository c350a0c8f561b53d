#include "engine/tokenizer/pretokenizer.h"

#include <array>
#include <cstdint>

#include "engine/common/utf8.h"
#include "utf8proc.h"

namespace dcf {
namespace {

std::array<CharClass, 128> BuildAsciiTable() {
  std::array<CharClass, 128> t;
  for (int c = 0; c < 128; ++c) t[c] = ClassifyCodePoint(static_cast<char32_t>(c));
  return t;
}

const std::array<CharClass, 128>& AsciiTable() {
  static const std::array<CharClass, 128> table = BuildAsciiTable();
  return table;
}

// Length of the contraction ('s 't 're 've 'm 'll 'd) starting at text[pos], or 0.
size_t ContractionLength(std::string_view text, size_t pos) {
  if (text[pos] != '\'' || pos + 1 >= text.size()) return 0;
  const char c1 = text[pos + 1];
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (pos + 2 >= text.size()) return 0;
  const char c2 = text[pos + 2];
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

}  // namespace

CharClass ClassifyCodePoint(char32_t cp) {
  if ((cp >= 0x09 && cp <= 0x0D) || cp == 0x85) return CharClass::kSpace;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return CharClass::kLetter;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return CharClass::kNumber;
    case UTF8PROC_CATEGORY_ZS:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
      return CharClass::kSpace;
    default:
      return CharClass::kOther;
  }
}

CharClass ClassifyAt(std::string_view text, size_t pos, size_t* length) {
  const auto b = static_cast<uint8_t>(text[pos]);
  if (b < 0x80) {
    *length = 1;
    return AsciiTable()[b];
  }
  const Utf8Char c = DecodeUtf8At(text, pos);
  if (c.status != Utf8Status::kValid) {
    *length = 1;
    return CharClass::kOther;
  }
  *length = c.length;
  return ClassifyCodePoint(c.code_point);
}

void SplitGpt2Pattern(std::string_view text, std::vector<std::string_view>* pieces) {
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    if (const size_t len = ContractionLength(text, i); len > 0) {
      pieces->push_back(text.substr(i, len));
      i += len;
      continue;
    }
    size_t len0;
    const CharClass c0 = ClassifyAt(text, i, &len0);
    // ` ?X+` alternatives: an optional U+0020 followed by a run of one class.
    size_t run_start = i;
    CharClass run_class = c0;
    if (text[i] == ' ' && i + 1 < n) {
      size_t len1;
      const CharClass c1 = ClassifyAt(text, i + 1, &len1);
      if (c1 != CharClass::kSpace) {
        run_start = i + 1;
        run_class = c1;
      }
    }
    if (run_class != CharClass::kSpace) {
      size_t j = run_start;
      while (j < n) {
        size_t len;
        if (ClassifyAt(text, j, &len) != run_class) break;
        j += len;
      }
      pieces->push_back(text.substr(i, j - i));
      i = j;
      continue;
    }
    // Whitespace: `\s+(?!\S)` takes the whole run at the end of the text, or the run minus its
    // last character when more than one; a single space before a non-space falls to `\s+`.
    size_t j = i + len0;
    size_t last_start = i;
    while (j < n) {
      size_t len;
      if (ClassifyAt(text, j, &len) != CharClass::kSpace) break;
      last_start = j;
      j += len;
    }
    const size_t end = (j == n || last_start == i) ? j : last_start;
    pieces->push_back(text.substr(i, end - i));
    i = end;
  }
}

}  // namespace dcf
