// Hugging Face compatible byte-level BPE tokenizer (GPT-2 family).
//
// Loads a tokenizer.json (BPE model, ByteLevel pre-tokenizer and decoder, optional NFC
// normalizer, added tokens) or a vocab.json + merges.txt pair, and reproduces the ids of
// `tokenizers`' Tokenizer.encode(text, add_special_tokens=True) and the text of
// Tokenizer.decode(ids). Encoding pipeline: split the text on added tokens (leftmost-longest,
// honouring lstrip/rstrip/single_word/normalized), normalize, split with the GPT-2 pattern,
// map bytes to the byte-level alphabet and apply BPE merges by rank.
//
// Invalid UTF-8 input: Encode never fails on it. Byte-level BPE can represent every byte, so
// each ill-formed byte is encoded through its single-byte token (scanned as a punctuation-like
// character by the pre-tokenizer). The raw bytes of the ids (TokenBytes) therefore always
// concatenate back to the input, but Decode returns text, so there the ill-formed bytes come
// back as U+FFFD: Decode(Encode(x)) == x exactly when x is valid UTF-8 (and no added token with
// lstrip/rstrip swallowed whitespace).
//
// Thread-safety: a Tokenizer is immutable after construction except for its internal BPE word
// cache, which is mutex-guarded; every const method may be called concurrently from any number
// of threads. Ownership: factories return a unique_ptr; a StreamingDetokenizer borrows the
// Tokenizer, which must outlive it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/tokenizer/added_tokens.h"
#include "engine/tokenizer/bpe.h"
#include "engine/tokenizer/tokenizer_spec.h"

namespace dcf {

class Tokenizer {
 public:
  // Loads a tokenizer.json. NotFound when the file is missing; InvalidArgument (naming the
  // offending field) for malformed JSON or unsupported settings. Every factory also refuses
  // (InvalidArgument, naming the id) ids that are not dense and unique: each id from 0 to the
  // largest must name exactly one token of model.vocab or added_tokens (an added token may
  // repeat a vocabulary entry with the same string and id, as GPT-2's <|endoftext|> does).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromFile(
      const std::string& tokenizer_json_path);
  // Loads the GPT-2 vocab.json + merges.txt form (add_prefix_space off, GPT-2 split pattern,
  // "<|endoftext|>" as a special added token when it is in the vocabulary).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromVocabMerges(const std::string& vocab_json,
                                                                    const std::string& merges_txt);
  // dir/tokenizer.json if present, else dir/vocab.json + dir/merges.txt, else NotFound.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromModelDir(const std::string& dir);
  // Builds from an already parsed description (used by the factories and by tests).
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromSpec(TokenizerSpec spec);

  // Token ids of `text` (no BOS/EOS is added). Never fails for a loaded tokenizer; the StatusOr
  // is kept for API stability. See the header comment for invalid UTF-8.
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text) const;
  // Encode under a budget, for callers with a token limit (a server's longest prompt): the
  // ids of `text` when it encodes to at most `max_tokens` ids, else OutOfRange ("the text
  // encodes to more than N tokens"), found without encoding all of a long text: encoding
  // stops once the ids pass the budget, and a pre-tokenized piece of n bytes, which yields at
  // least n / (the longest token's bytes) ids, is not encoded when that alone passes it.
  absl::StatusOr<std::vector<int32_t>> EncodeWithLimit(std::string_view text,
                                                       size_t max_tokens) const;

  // Text of `ids` with HF ByteLevel decoder semantics: the ids' bytes are concatenated and every
  // maximal ill-formed UTF-8 subsequence becomes U+FFFD. Special added tokens are included unless
  // `skip_special_tokens`. InvalidArgument for an id that names no token.
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids,
                                     bool skip_special_tokens = false) const;

  // One more than the largest id of the vocabulary and added tokens (50257 for GPT-2); every
  // id below it names a token.
  int32_t vocab_size() const { return static_cast<int32_t>(id_to_token_.size()); }
  // Id of a token spelled as in the vocabulary (byte-level form, e.g. "Ġthe") or of an added
  // token's content.
  std::optional<int32_t> TokenToId(std::string_view token) const;
  // Id of "<|endoftext|>" when the tokenizer has it.
  std::optional<int32_t> eos_token_id() const { return eos_token_id_; }
  // The token's vocabulary spelling, or "" for an id that names no token.
  std::string IdToToken(int32_t id) const;

  // The raw bytes that `id` decodes to (possibly an incomplete UTF-8 sequence), or nullopt for
  // an id that names no token. The view stays valid as long as the Tokenizer.
  std::optional<std::string_view> TokenBytes(int32_t id) const;
  // True for added tokens marked special.
  bool IsSpecial(int32_t id) const;

 private:
  Tokenizer() = default;
  // Normalizes, pre-tokenizes and BPE-encodes one plain-text segment (no added tokens in it).
  // False as soon as `ids` would pass `max_tokens` (then `ids` is incomplete).
  bool EncodePlain(std::string_view text, size_t max_tokens, std::vector<std::string_view>* pieces,
                   std::vector<int32_t>* ids) const;
  // False when a piece of `bytes` bytes would surely pass the budget.
  bool PieceFits(size_t bytes, size_t have, size_t max_tokens) const;

  std::unique_ptr<BpeModel> bpe_;
  std::unique_ptr<AddedTokenMatcher> raw_added_;         // added tokens with normalized=false
  std::unique_ptr<AddedTokenMatcher> normalized_added_;  // added tokens with normalized=true
  bool nfc_normalizer_ = false;
  bool add_prefix_space_ = false;
  bool use_regex_ = true;
  // The longest token's bytes, and whether every byte has a token of its own (else a byte
  // can be dropped, and a piece's length bounds nothing): see EncodeWithLimit.
  size_t max_token_bytes_ = 1;
  bool every_byte_has_token_ = false;
  std::vector<std::string> id_to_token_;  // [vocab_size]; "" where no token
  std::vector<std::string> id_bytes_;     // [vocab_size]; decoded raw bytes
  std::vector<uint8_t> id_flags_;         // [vocab_size]; kValid | kSpecial bits
  absl::flat_hash_map<std::string, int32_t> token_to_id_;
  std::optional<int32_t> eos_token_id_;
};

}  // namespace dcf

// The streaming half of the API lives in its own file pair; include it here so that users of
// the tokenizer get both classes from one header.
#include "engine/tokenizer/streaming_detokenizer.h"  // IWYU pragma: export
