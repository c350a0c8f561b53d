// Added (and special) tokens of a Hugging Face tokenizer, and the splitting of input text around
// them. Matching follows tokenizers' AddedVocabulary: leftmost match first, the longest token at
// that position; `single_word` rejects a match touching an alphanumeric character; `lstrip` /
// `rstrip` make the match swallow adjacent Unicode whitespace (which is then not encoded).
// Immutable after construction; thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dcf {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool normalized = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

// One piece of text after splitting: either an added token (id >= 0) or plain text (id == -1).
struct TextSegment {
  std::string_view text;
  int32_t id;
};

class AddedTokenMatcher {
 public:
  // Tokens with empty content are ignored.
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);

  bool empty() const { return tokens_.empty(); }

  // Appends the segments of `text`, in order, to `out`. Plain-text segments are never empty.
  void Split(std::string_view text, std::vector<TextSegment>* out) const;

 private:
  std::vector<AddedToken> tokens_;
  // For each first byte, indices into tokens_ ordered by decreasing content length.
  std::array<std::vector<int>, 256> by_first_byte_;
};

}  // namespace dcf
