#include "engine/tokenizer/streaming_detokenizer.h"

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/common/utf8.h"

namespace dcf {

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

absl::StatusOr<std::string> StreamingDetokenizer::Push(int32_t id) {
  const std::optional<std::string_view> bytes = tokenizer_.TokenBytes(id);
  if (!bytes.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("StreamingDetokenizer: unknown token id ", id));
  }
  std::string out;
  if (skip_special_tokens_ && tokenizer_.IsSpecial(id)) return out;
  // Lossy decoding is decided left to right with at most 4 bytes of lookahead, so converting
  // everything except a still-incomplete tail gives exactly the prefix of the whole decode.
  pending_.append(*bytes);
  const size_t consumed = AppendUtf8Lossy(pending_, &out, /*hold_incomplete_tail=*/true);
  pending_.erase(0, consumed);
  return out;
}

std::string StreamingDetokenizer::Finish() {
  std::string out;
  AppendUtf8Lossy(pending_, &out, /*hold_incomplete_tail=*/false);
  pending_.clear();
  return out;
}

}  // namespace dcf
