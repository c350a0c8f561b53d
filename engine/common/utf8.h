// UTF-8 scanning helpers (the tokenizer, the server's request parser, dcformer-cli's flag
// checks): strict decoding of one character, validation, and lossy conversion with the "maximal
// subpart" rule that Rust's String::from_utf8_lossy (and therefore Hugging Face tokenizers'
// decode) uses: every maximal invalid subsequence becomes one U+FFFD. Pure functions,
// thread-safe.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dcf {

enum class Utf8Status {
  kValid,       // a complete, well-formed character
  kInvalid,     // an ill-formed subsequence; replace it with one U+FFFD
  kIncomplete,  // the bytes up to the end of the input are a valid but truncated prefix
};

struct Utf8Char {
  Utf8Status status;
  // kValid: the character's length (1..4). kInvalid: the length of the maximal ill-formed
  // subpart (1..3). kIncomplete: the number of bytes left in the input (1..3).
  size_t length;
  char32_t code_point;  // meaningful for kValid only
};

// Examines the character starting at text[pos]. Requires pos < text.size().
Utf8Char DecodeUtf8At(std::string_view text, size_t pos);

// True when `text` is entirely well-formed UTF-8 (no surrogates, no overlongs, <= U+10FFFF).
bool IsValidUtf8(std::string_view text);

// Offset of the first byte that starts no valid UTF-8 character (a truncated character at the
// end included), or std::string_view::npos when `text` is valid UTF-8.
size_t FirstInvalidUtf8(std::string_view text);

// Appends the UTF-8 encoding of `cp` (which must be a Unicode scalar value) to `out`.
void AppendUtf8(char32_t cp, std::string* out);

// Appends `bytes` to `out` with every maximal ill-formed subsequence replaced by U+FFFD.
// If `hold_incomplete_tail` is true, a truncated but valid-so-far sequence at the very end is
// not converted; the return value is the number of bytes consumed (bytes.size() minus the
// held-back tail). With false, the tail becomes one U+FFFD and all bytes are consumed.
size_t AppendUtf8Lossy(std::string_view bytes, std::string* out, bool hold_incomplete_tail);

}  // namespace dcf
