// A byte-level tokenizer over 300 ids (the golden models' vocabulary): 0..255 are single
// bytes, 256..298 two-byte tokens "aA", "aB", ..., 299 is the special <|endoftext|> (EOS).
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "engine/common/logging.h"
#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/tokenizer.h"

namespace dcf::testing {

inline std::unique_ptr<Tokenizer> TinyTokenizer() {
  TokenizerSpec spec;
  for (int b = 0; b < 256; ++b) {
    std::string t;
    AppendByteLevel(std::string(1, static_cast<char>(b)), &t);
    spec.vocab[t] = b;
  }
  for (int i = 256; i < 299; ++i) {
    std::string t;
    AppendByteLevel(std::string{'a', static_cast<char>('A' + (i - 256) % 26)}, &t);
    if (spec.vocab.contains(t)) AppendByteLevel("z", &t);
    spec.vocab[t] = i;
  }
  AddedToken eos;
  eos.id = 299;
  eos.content = "<|endoftext|>";
  eos.special = true;
  spec.added_tokens.push_back(eos);
  auto tok = Tokenizer::FromSpec(std::move(spec));
  DCF_CHECK(tok.ok()) << tok.status();
  return std::move(*tok);
}

}  // namespace dcf::testing
