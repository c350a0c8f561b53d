// Hand-written scanner equivalent to the GPT-2 split pattern used by the Hugging Face ByteLevel
// pre-tokenizer (use_regex=true):
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Character classes come from utf8proc's general categories: letters are L*, numbers N*, and
// whitespace is the Unicode White_Space property (Z* plus U+0009..U+000D and U+0085).
// Bytes that are not well-formed UTF-8 are scanned one byte at a time as "other" characters (the
// class of punctuation), so every input byte lands in exactly one piece.
// Pure functions, thread-safe, no allocation besides growing `pieces`.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace dcf {

enum class CharClass : unsigned char { kLetter, kNumber, kSpace, kOther };

// Classifies a Unicode scalar value.
CharClass ClassifyCodePoint(char32_t cp);

// Class and byte length of the character at text[pos] (pos < text.size()). Ill-formed bytes are
// reported as kOther with length 1.
CharClass ClassifyAt(std::string_view text, size_t pos, size_t* length);

// Appends the pieces of `text` (views into it, in order, covering it exactly) to `pieces`.
void SplitGpt2Pattern(std::string_view text, std::vector<std::string_view>* pieces);

}  // namespace dcf
