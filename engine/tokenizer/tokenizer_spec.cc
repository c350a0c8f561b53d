#include "engine/tokenizer/tokenizer_spec.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "engine/common/status_macros.h"
#include "nlohmann/json.hpp"

namespace dcf {
namespace {

using Json = nlohmann::json;

absl::Status Unsupported(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("tokenizer: unsupported ", field, ": ", what));
}

absl::StatusOr<Json> ParseJson(std::string_view text, absl::string_view what) {
  Json json = Json::parse(text.begin(), text.end(), /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer: ", what, " is not valid JSON"));
  }
  return json;
}

// Reads an optional boolean field; a present non-boolean is an error.
absl::StatusOr<bool> GetBool(const Json& obj, const char* key, bool fallback,
                             absl::string_view path) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: ", path, ".", key, " must be a boolean"));
  }
  return it->get<bool>();
}

// The "type" string of a component object, or an error naming `path`.
absl::StatusOr<std::string> GetType(const Json& obj, absl::string_view path) {
  if (!obj.is_object()) return Unsupported(path, "not an object");
  auto it = obj.find("type");
  if (it == obj.end() || !it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer: ", path, ".type is missing"));
  }
  return it->get<std::string>();
}

absl::Status ParseVocab(const Json& vocab, absl::string_view path, TokenizerSpec* spec) {
  if (!vocab.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer: ", path, " must be an object"));
  }
  spec->vocab.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 ||
        it->get<int64_t>() >= std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer: ", path, "[\"", it.key(), "\"] is not a valid id"));
    }
    spec->vocab.insert_or_assign(it.key(), static_cast<int32_t>(it->get<int64_t>()));
  }
  return absl::OkStatus();
}

// One merge written as "left right" (both the merges.txt and the older tokenizer.json form).
absl::Status AddMergeLine(absl::string_view line, absl::string_view where, TokenizerSpec* spec) {
  std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
  if (parts.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: ", where, " is not a pair \"a b\": \"", line, "\""));
  }
  spec->merges.emplace_back(std::string(parts[0]), std::string(parts[1]));
  return absl::OkStatus();
}

absl::Status ParseModel(const Json& model, TokenizerSpec* spec) {
  if (!model.is_object()) return Unsupported("model", "not an object");
  if (auto it = model.find("type"); it != model.end() && !(it->is_string() && *it == "BPE")) {
    return Unsupported("model.type", it->dump());
  }
  if (auto it = model.find("dropout");
      it != model.end() && !it->is_null() && !(it->is_number() && it->get<double>() == 0.0)) {
    return Unsupported("model.dropout", it->dump());
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (auto it = model.find(key); it != model.end() && !it->is_null() &&
                                   !(it->is_string() && it->get<std::string>().empty())) {
      return Unsupported(absl::StrCat("model.", key), it->dump());
    }
  }
  ASSIGN_OR_RETURN(const bool byte_fallback, GetBool(model, "byte_fallback", false, "model"));
  if (byte_fallback) return Unsupported("model.byte_fallback", "true");
  ASSIGN_OR_RETURN(spec->ignore_merges, GetBool(model, "ignore_merges", false, "model"));
  if (auto it = model.find("unk_token"); it != model.end() && !it->is_null()) {
    if (!it->is_string()) return Unsupported("model.unk_token", it->dump());
    spec->unk_token = it->get<std::string>();
  }
  auto vocab = model.find("vocab");
  if (vocab == model.end()) return absl::InvalidArgumentError("tokenizer: model.vocab is missing");
  RETURN_IF_ERROR(ParseVocab(*vocab, "model.vocab", spec));
  auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array()) {
    return absl::InvalidArgumentError("tokenizer: model.merges is missing or not an array");
  }
  spec->merges.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const Json& m = (*merges)[i];
    const std::string where = absl::StrCat("model.merges[", i, "]");
    if (m.is_string()) {
      RETURN_IF_ERROR(AddMergeLine(m.get_ref<const std::string&>(), where, spec));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      spec->merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer: ", where, " is malformed"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseByteLevel(const Json& obj, absl::string_view path, TokenizerSpec* spec) {
  ASSIGN_OR_RETURN(spec->add_prefix_space, GetBool(obj, "add_prefix_space", true, path));
  ASSIGN_OR_RETURN(spec->use_regex, GetBool(obj, "use_regex", true, path));
  return absl::OkStatus();
}

absl::Status ParsePreTokenizer(const Json& pre, TokenizerSpec* spec) {
  if (pre.is_null()) return Unsupported("pre_tokenizer", "null (a ByteLevel one is required)");
  ASSIGN_OR_RETURN(const std::string type, GetType(pre, "pre_tokenizer"));
  if (type == "ByteLevel") return ParseByteLevel(pre, "pre_tokenizer", spec);
  if (type == "Sequence") {
    auto list = pre.find("pretokenizers");
    if (list != pre.end() && list->is_array() && list->size() == 1) {
      ASSIGN_OR_RETURN(const std::string inner,
                       GetType((*list)[0], "pre_tokenizer.pretokenizers[0]"));
      if (inner == "ByteLevel") {
        return ParseByteLevel((*list)[0], "pre_tokenizer.pretokenizers[0]", spec);
      }
    }
    return Unsupported("pre_tokenizer.type", "Sequence other than [ByteLevel]");
  }
  return Unsupported("pre_tokenizer.type", type);
}

absl::Status ParseNormalizer(const Json& norm, TokenizerSpec* spec) {
  if (norm.is_null()) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::string type, GetType(norm, "normalizer"));
  if (type == "NFC") {
    spec->nfc_normalizer = true;
    return absl::OkStatus();
  }
  return Unsupported("normalizer.type", type);
}

absl::Status ParseAddedTokens(const Json& list, TokenizerSpec* spec) {
  if (list.is_null()) return absl::OkStatus();
  if (!list.is_array()) return Unsupported("added_tokens", "not an array");
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& t = list[i];
    const std::string path = absl::StrCat("added_tokens[", i, "]");
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
        t["id"].get<int64_t>() < 0 ||
        t["id"].get<int64_t>() >= std::numeric_limits<int32_t>::max() || !t.contains("content") ||
        !t["content"].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokenizer: ", path, " needs an integer id and a string content"));
    }
    AddedToken token;
    token.id = static_cast<int32_t>(t["id"].get<int64_t>());
    token.content = t["content"].get<std::string>();
    ASSIGN_OR_RETURN(token.special, GetBool(t, "special", false, path));
    ASSIGN_OR_RETURN(token.normalized, GetBool(t, "normalized", !token.special, path));
    ASSIGN_OR_RETURN(token.lstrip, GetBool(t, "lstrip", false, path));
    ASSIGN_OR_RETURN(token.rstrip, GetBool(t, "rstrip", false, path));
    ASSIGN_OR_RETURN(token.single_word, GetBool(t, "single_word", false, path));
    spec->added_tokens.push_back(std::move(token));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TokenizerSpec> ParseTokenizerJson(std::string_view json_text) {
  ASSIGN_OR_RETURN(const Json json, ParseJson(json_text, "tokenizer.json"));
  if (!json.is_object()) return Unsupported("tokenizer.json", "top level is not an object");
  TokenizerSpec spec;
  auto model = json.find("model");
  if (model == json.end()) return absl::InvalidArgumentError("tokenizer: model is missing");
  RETURN_IF_ERROR(ParseModel(*model, &spec));
  const Json null_json;
  auto field = [&](const char* key) -> const Json& {
    auto it = json.find(key);
    return it == json.end() ? null_json : *it;
  };
  RETURN_IF_ERROR(ParseNormalizer(field("normalizer"), &spec));
  RETURN_IF_ERROR(ParsePreTokenizer(field("pre_tokenizer"), &spec));
  if (const Json& post = field("post_processor"); !post.is_null()) {
    ASSIGN_OR_RETURN(const std::string type, GetType(post, "post_processor"));
    // ByteLevel post-processing only trims offsets; anything else (templates) adds ids.
    if (type != "ByteLevel") return Unsupported("post_processor.type", type);
  }
  const Json& decoder = field("decoder");
  if (decoder.is_null()) return Unsupported("decoder", "null (a ByteLevel one is required)");
  ASSIGN_OR_RETURN(const std::string decoder_type, GetType(decoder, "decoder"));
  if (decoder_type != "ByteLevel") return Unsupported("decoder.type", decoder_type);
  RETURN_IF_ERROR(ParseAddedTokens(field("added_tokens"), &spec));
  return spec;
}

absl::StatusOr<TokenizerSpec> ParseVocabMerges(std::string_view vocab_json,
                                               std::string_view merges_txt) {
  ASSIGN_OR_RETURN(const Json json, ParseJson(vocab_json, "vocab.json"));
  TokenizerSpec spec;
  RETURN_IF_ERROR(ParseVocab(json, "vocab.json", &spec));
  size_t line_no = 0;
  for (absl::string_view line :
       absl::StrSplit(absl::string_view(merges_txt.data(), merges_txt.size()), '\n')) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.substr(0, 8) == "#version")) continue;
    RETURN_IF_ERROR(AddMergeLine(line, absl::StrCat("merges.txt line ", line_no), &spec));
  }
  if (auto it = spec.vocab.find("<|endoftext|>"); it != spec.vocab.end()) {
    AddedToken eos;
    eos.id = it->second;
    eos.content = "<|endoftext|>";
    eos.special = true;
    spec.added_tokens.push_back(std::move(eos));
  }
  return spec;
}

}  // namespace dcf
