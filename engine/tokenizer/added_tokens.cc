#include "engine/tokenizer/added_tokens.h"

#include <algorithm>
#include <cstdint>

#include "engine/tokenizer/pretokenizer.h"
#include "engine/common/utf8.h"

namespace dcf {
namespace {

// Rust's char::is_alphanumeric: alphabetic or numeric. Approximated by the L* and N* categories.
bool IsWordChar(CharClass c) { return c == CharClass::kLetter || c == CharClass::kNumber; }

// Class of the character that ends just before `pos` (pos > 0).
CharClass ClassBefore(std::string_view text, size_t pos) {
  size_t start = pos - 1;
  // Step back over continuation bytes (at most 3) to a plausible lead byte.
  while (start > 0 && pos - start < 4 && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) {
    --start;
  }
  size_t len;
  const CharClass c = ClassifyAt(text, start, &len);
  return start + len == pos ? c : CharClass::kOther;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) {
  for (AddedToken& t : tokens) {
    if (!t.content.empty()) tokens_.push_back(std::move(t));
  }
  for (int i = 0; i < static_cast<int>(tokens_.size()); ++i) {
    by_first_byte_[static_cast<uint8_t>(tokens_[i].content[0])].push_back(i);
  }
  for (auto& list : by_first_byte_) {
    std::stable_sort(list.begin(), list.end(), [this](int a, int b) {
      return tokens_[a].content.size() > tokens_[b].content.size();
    });
  }
}

void AddedTokenMatcher::Split(std::string_view text, std::vector<TextSegment>* out) const {
  size_t plain_start = 0;  // start of the text not yet emitted
  size_t pos = 0;
  while (pos < text.size()) {
    const auto& candidates = by_first_byte_[static_cast<uint8_t>(text[pos])];
    const AddedToken* match = nullptr;
    for (int index : candidates) {
      const AddedToken& t = tokens_[index];
      if (text.compare(pos, t.content.size(), t.content) == 0) {
        match = &t;
        break;
      }
    }
    if (match == nullptr) {
      ++pos;
      continue;
    }
    size_t start = pos;
    size_t stop = pos + match->content.size();
    if (match->single_word) {
      const bool word_before = start > 0 && IsWordChar(ClassBefore(text, start));
      size_t len;
      const bool word_after = stop < text.size() && IsWordChar(ClassifyAt(text, stop, &len));
      if (word_before || word_after) {
        pos = stop;  // like HF's non-overlapping match iterator, resume after the rejected match
        continue;
      }
    }
    if (match->lstrip) {
      while (start > plain_start) {
        size_t back = start - 1;
        while (back > plain_start && (static_cast<uint8_t>(text[back]) & 0xC0) == 0x80) --back;
        size_t len;
        if (ClassifyAt(text, back, &len) != CharClass::kSpace || back + len != start) break;
        start = back;
      }
    }
    if (match->rstrip) {
      while (stop < text.size()) {
        size_t len;
        if (ClassifyAt(text, stop, &len) != CharClass::kSpace) break;
        stop += len;
      }
    }
    if (start > plain_start) out->push_back({text.substr(plain_start, start - plain_start), -1});
    out->push_back({text.substr(start, stop - start), match->id});
    plain_start = pos = stop;
  }
  if (plain_start < text.size()) out->push_back({text.substr(plain_start), -1});
}

}  // namespace dcf
