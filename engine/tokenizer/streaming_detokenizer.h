// Incremental decoding for token streaming. Push ids one at a time; each call returns the text
// that has become final, holding back the bytes of a UTF-8 character that is not complete yet.
// Invariant: the concatenation of every Push result followed by Finish() equals
// Tokenizer::Decode(all pushed ids, skip_special_tokens), and every returned piece is valid
// UTF-8 (possibly empty).
//
// Not thread-safe (one instance per stream); it borrows the Tokenizer, which must outlive it.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace dcf {

class Tokenizer;

class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens = false);

  // Appends `id` and returns the newly final text. InvalidArgument for an id that names no
  // token; the stream state is unchanged then.
  absl::StatusOr<std::string> Push(int32_t id);

  // Flushes held-back bytes (an incomplete character becomes one U+FFFD) and resets the stream
  // so it can be reused.
  std::string Finish();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_tokens_;
  std::string pending_;  // bytes of an unfinished UTF-8 character, at most 3
};

}  // namespace dcf
