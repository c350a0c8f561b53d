#include "engine/tokenizer/tokenizer.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "engine/common/file_util.h"
#include "engine/common/status_macros.h"
#include "engine/common/utf8.h"
#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/pretokenizer.h"
#include "utf8proc.h"

namespace dcf {
namespace {

constexpr uint8_t kValid = 1;
constexpr uint8_t kSpecial = 2;
constexpr char kEndOfText[] = "<|endoftext|>";

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// NFC of `text` into `out`. Ill-formed bytes are kept as they are and act as boundaries: each
// maximal well-formed run is normalized on its own.
void AppendNfc(std::string_view text, std::string* out) {
  size_t i = 0;
  while (i < text.size()) {
    size_t j = i;
    while (j < text.size()) {
      const Utf8Char c = DecodeUtf8At(text, j);
      if (c.status != Utf8Status::kValid) break;
      j += c.length;
    }
    if (j > i) {
      utf8proc_uint8_t* normalized = nullptr;
      const utf8proc_ssize_t n =
          utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + i),
                       static_cast<utf8proc_ssize_t>(j - i), &normalized,
                       static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
      if (n >= 0) {
        out->append(reinterpret_cast<const char*>(normalized), static_cast<size_t>(n));
      } else {
        out->append(text.data() + i, j - i);  // cannot happen for well-formed input
      }
      std::free(normalized);
    }
    if (j < text.size()) {
      const Utf8Char bad = DecodeUtf8At(text, j);
      out->append(text.data() + j, bad.length);
      j += bad.length;
    }
    i = j;
  }
}

// Every id in [0, size) must name exactly one token: no two strings of model.vocab share an
// id, an added token reuses an id of model.vocab only for the same string (as GPT-2's
// <|endoftext|> does), two added tokens with one id agree on the string, and no id below the
// largest is missing. A hole or a shared id would let the model produce a token whose text is
// undefined (the server and the offline tools would disagree on it), so both are load errors.
absl::Status CheckIdsDense(const TokenizerSpec& spec, size_t size) {
  std::vector<const std::string*> owner(size, nullptr);  // [size]; the string naming each id
  auto quoted = [](const std::string& token) {
    return absl::StrCat("\"", absl::Utf8SafeCEscape(token), "\"");
  };
  for (const auto& [token, id] : spec.vocab) {
    if (owner[id] != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer: model.vocab gives id ", id, " to both ", quoted(*owner[id]),
                       " and ", quoted(token), " (every id must name one token)"));
    }
    owner[id] = &token;
  }
  for (size_t i = 0; i < spec.added_tokens.size(); ++i) {
    const AddedToken& t = spec.added_tokens[i];
    if (owner[t.id] != nullptr && *owner[t.id] != t.content) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer: added_tokens[", i, "] gives id ", t.id, " to ", quoted(t.content),
          ", which already names ", quoted(*owner[t.id]), " (every id must name one token)"));
    }
    owner[t.id] = &t.content;
  }
  for (size_t id = 0; id < size; ++id) {
    if (owner[id] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokenizer: no token has id ", id, ", below the largest id ", size - 1,
          " (ids must be dense: every id from 0 to the largest names one token of model.vocab "
          "or added_tokens)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(
    const std::string& tokenizer_json_path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(tokenizer_json_path));
  ASSIGN_OR_RETURN(TokenizerSpec spec, ParseTokenizerJson(text));
  return FromSpec(std::move(spec));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromVocabMerges(
    const std::string& vocab_json, const std::string& merges_txt) {
  ASSIGN_OR_RETURN(const std::string vocab_text, ReadFileToString(vocab_json));
  ASSIGN_OR_RETURN(const std::string merges_text, ReadFileToString(merges_txt));
  ASSIGN_OR_RETURN(TokenizerSpec spec, ParseVocabMerges(vocab_text, merges_text));
  return FromSpec(std::move(spec));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromModelDir(const std::string& dir) {
  const std::string json_path = absl::StrCat(dir, "/tokenizer.json");
  if (FileExists(json_path)) return FromFile(json_path);
  const std::string vocab_path = absl::StrCat(dir, "/vocab.json");
  const std::string merges_path = absl::StrCat(dir, "/merges.txt");
  if (FileExists(vocab_path) && FileExists(merges_path)) {
    return FromVocabMerges(vocab_path, merges_path);
  }
  return absl::NotFoundError(
      absl::StrCat("tokenizer: ", dir, " has neither tokenizer.json nor vocab.json + merges.txt"));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromSpec(TokenizerSpec spec) {
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  BpeModel::Options options;
  options.ignore_merges = spec.ignore_merges;
  if (spec.unk_token.has_value()) {
    auto it = spec.vocab.find(*spec.unk_token);
    if (it == spec.vocab.end()) {
      return absl::InvalidArgumentError("tokenizer: model.unk_token is not in the vocab");
    }
    options.unk_id = it->second;
  }
  ASSIGN_OR_RETURN(tok->bpe_, BpeModel::Create(spec.vocab, spec.merges, options));
  tok->nfc_normalizer_ = spec.nfc_normalizer;
  tok->add_prefix_space_ = spec.add_prefix_space;
  tok->use_regex_ = spec.use_regex;

  int32_t max_id = -1;
  for (const auto& [token, id] : spec.vocab) max_id = std::max(max_id, id);
  for (const AddedToken& t : spec.added_tokens) max_id = std::max(max_id, t.id);
  // Ids index dense tables; a sparse id far beyond the number of tokens would make a tiny
  // file allocate gigabytes.
  const size_t num_tokens = spec.vocab.size() + spec.added_tokens.size();
  if (static_cast<size_t>(max_id) >= 4 * num_tokens + 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokenizer: token id ", max_id, " is far beyond the ", num_tokens,
        " tokens of model.vocab and added_tokens (ids must be dense)"));
  }
  const size_t size = static_cast<size_t>(max_id + 1);
  RETURN_IF_ERROR(CheckIdsDense(spec, size));
  tok->id_to_token_.resize(size);
  tok->id_bytes_.resize(size);
  tok->id_flags_.assign(size, 0);
  auto define = [&](const std::string& token, int32_t id, bool special) {
    tok->id_to_token_[id] = token;
    tok->id_bytes_[id] = ByteLevelDecodeToken(token);
    tok->id_flags_[id] = kValid | (special ? kSpecial : 0);
  };
  for (const auto& [token, id] : spec.vocab) define(token, id, false);
  tok->every_byte_has_token_ = true;
  for (int b = 0; b < 256; ++b) {
    const char byte = static_cast<char>(b);
    std::string spelled;
    AppendByteLevel(std::string_view(&byte, 1), &spelled);
    tok->every_byte_has_token_ = tok->every_byte_has_token_ && spec.vocab.contains(spelled);
  }
  tok->token_to_id_ = std::move(spec.vocab);
  // Added tokens take precedence over the model's vocabulary, as in HF's id_to_token.
  std::vector<AddedToken> raw, normalized;
  for (AddedToken& t : spec.added_tokens) {
    define(t.content, t.id, t.special);
    tok->token_to_id_.insert_or_assign(t.content, t.id);
    (t.normalized ? normalized : raw).push_back(std::move(t));
  }
  for (const std::string& bytes : tok->id_bytes_) {
    tok->max_token_bytes_ = std::max(tok->max_token_bytes_, bytes.size());
  }
  tok->raw_added_ = std::make_unique<AddedTokenMatcher>(std::move(raw));
  tok->normalized_added_ = std::make_unique<AddedTokenMatcher>(std::move(normalized));
  tok->eos_token_id_ = tok->TokenToId(kEndOfText);
  return tok;
}

bool Tokenizer::PieceFits(size_t bytes, size_t have, size_t max_tokens) const {
  if (!every_byte_has_token_) return true;
  const size_t at_least = (bytes + max_token_bytes_ - 1) / max_token_bytes_;
  return at_least <= max_tokens - std::min(have, max_tokens);
}

bool Tokenizer::EncodePlain(std::string_view text, size_t max_tokens,
                            std::vector<std::string_view>* pieces,
                            std::vector<int32_t>* ids) const {
  std::string prefixed;
  if (add_prefix_space_ && text.front() != ' ') {
    prefixed.reserve(text.size() + 1);
    prefixed.push_back(' ');
    prefixed.append(text);
    text = prefixed;
  }
  // The pieces partition the segment, so its length alone may already pass the budget.
  if (!PieceFits(text.size(), ids->size(), max_tokens)) return false;
  if (!use_regex_) {
    bpe_->EncodeWord(text, ids);
    return ids->size() <= max_tokens;
  }
  pieces->clear();
  SplitGpt2Pattern(text, pieces);
  for (std::string_view piece : *pieces) {
    if (!PieceFits(piece.size(), ids->size(), max_tokens)) return false;
    bpe_->EncodeWord(piece, ids);
    if (ids->size() > max_tokens) return false;
  }
  return true;
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text) const {
  return EncodeWithLimit(text, SIZE_MAX);
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::EncodeWithLimit(std::string_view text,
                                                               size_t max_tokens) const {
  const auto too_long = [max_tokens]() {
    return absl::OutOfRangeError(
        absl::StrCat("the text encodes to more than ", max_tokens, " tokens"));
  };
  std::vector<int32_t> ids;
  ids.reserve(std::min(text.size() / 3, max_tokens) + 4);
  std::vector<std::string_view> pieces;
  std::vector<TextSegment> raw_segments, segments;
  std::string normalized_text;
  raw_added_->Split(text, &raw_segments);
  for (const TextSegment& raw : raw_segments) {
    if (raw.id >= 0) {
      ids.push_back(raw.id);
      if (ids.size() > max_tokens) return too_long();
      continue;
    }
    std::string_view plain = raw.text;
    if (nfc_normalizer_) {
      normalized_text.clear();
      AppendNfc(plain, &normalized_text);
      plain = normalized_text;
    }
    segments.clear();
    normalized_added_->Split(plain, &segments);
    for (const TextSegment& s : segments) {
      if (s.id >= 0) {
        ids.push_back(s.id);
        if (ids.size() > max_tokens) return too_long();
      } else if (!EncodePlain(s.text, max_tokens, &pieces, &ids)) {
        return too_long();
      }
    }
  }
  return ids;
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const int32_t> ids,
                                              bool skip_special_tokens) const {
  std::string bytes;
  for (const int32_t id : ids) {
    const std::optional<std::string_view> b = TokenBytes(id);
    if (!b.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("Tokenizer::Decode: unknown token id ", id));
    }
    if (skip_special_tokens && (id_flags_[id] & kSpecial)) continue;
    bytes.append(*b);
  }
  std::string text;
  text.reserve(bytes.size());
  AppendUtf8Lossy(bytes, &text, /*hold_incomplete_tail=*/false);
  return text;
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  auto it = token_to_id_.find(absl::string_view(token.data(), token.size()));
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

std::string Tokenizer::IdToToken(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "";
  return id_to_token_[id];
}

std::optional<std::string_view> Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !(id_flags_[id] & kValid)) return std::nullopt;
  return std::string_view(id_bytes_[id]);
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && (id_flags_[id] & kSpecial);
}

}  // namespace dcf
