// Parsing of the two on-disk tokenizer forms into one plain description (TokenizerSpec):
//  * a Hugging Face tokenizer.json with a BPE model, ByteLevel pre-tokenizer and decoder;
//  * the original GPT-2 pair vocab.json + merges.txt.
// Anything that would change the token ids and that this implementation does not support is
// rejected with InvalidArgument naming the JSON field (e.g. "normalizer.type", "model.dropout").
// Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/tokenizer/added_tokens.h"

namespace dcf {

struct TokenizerSpec {
  absl::flat_hash_map<std::string, int32_t> vocab;          // byte-level token -> id
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  std::vector<AddedToken> added_tokens;
  std::optional<std::string> unk_token;
  bool ignore_merges = false;
  bool nfc_normalizer = false;    // normalizer {"type":"NFC"}; otherwise none
  bool add_prefix_space = false;  // ByteLevel pre-tokenizer flag
  bool use_regex = true;          // ByteLevel pre-tokenizer flag
};

// Parses the text of a tokenizer.json. Malformed JSON and unsupported settings are
// InvalidArgument.
absl::StatusOr<TokenizerSpec> ParseTokenizerJson(std::string_view json_text);

// Parses the texts of vocab.json and merges.txt. "<|endoftext|>", when in the vocabulary,
// becomes a special added token (as transformers' GPT2TokenizerFast does).
absl::StatusOr<TokenizerSpec> ParseVocabMerges(std::string_view vocab_json,
                                               std::string_view merges_txt);

}  // namespace dcf
