// GPT-2's byte-level alphabet: every byte 0..255 is mapped to one printable Unicode character
// (printable Latin-1 bytes map to themselves, the rest to U+0100..U+0143), so that any byte
// string can be written as a string of vocabulary characters. Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dcf {

// The character that stands for `byte` in byte-level vocabularies (e.g. ' ' -> U+0120 'Ġ').
char32_t ByteToByteLevelChar(uint8_t byte);

// Appends the byte-level spelling (UTF-8) of the raw `bytes` to `out`.
void AppendByteLevel(std::string_view bytes, std::string* out);

// Inverse of AppendByteLevel: the raw bytes spelled by a byte-level token, or nullopt when the
// token contains a character outside the 256-character alphabet (or is not valid UTF-8).
std::optional<std::string> ByteLevelToBytes(std::string_view token);

// Hugging Face ByteLevel decoder rule for one token: its raw bytes when every character is in
// the alphabet, otherwise the token's own UTF-8 bytes unchanged.
std::string ByteLevelDecodeToken(std::string_view token);

}  // namespace dcf
