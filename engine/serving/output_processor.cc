#include "engine/serving/output_processor.h"

#include <algorithm>
#include <string>

#include "engine/common/logging.h"
#include "engine/tokenizer/tokenizer.h"

namespace dcf {

OutputProcessor::OutputProcessor(const StoppingCriteria& stopping, const OutputOptions& output,
                                 std::optional<int32_t> eos, const Tokenizer* tokenizer,
                                 int prompt_len, int context)
    : stopping_(stopping),
      text_(output.text),
      eos_(stopping.ignore_eos ? std::nullopt
           : stopping.eos_token_id.has_value() ? stopping.eos_token_id
                                               : eos),
      tokenizer_(tokenizer),
      prompt_len_(prompt_len),
      context_(context) {
  // Stop strings need the text even when the client does not want it.
  if (output.text || !stopping.stop_strings.empty()) {
    DCF_CHECK(tokenizer != nullptr) << "text or stop strings without a tokenizer";
    detok_ = std::make_unique<StreamingDetokenizer>(*tokenizer, /*skip_special_tokens=*/true);
    stop_ = std::make_unique<StopStringMatcher>(stopping.stop_strings,
                                                stopping.include_stop_string);
  }
}

FinishReason OutputProcessor::StopAt(int32_t token) const {
  const std::vector<int32_t>& ids = stopping_.stop_token_ids;
  if (std::find(ids.begin(), ids.end(), token) != ids.end()) return FinishReason::kStopToken;
  if (eos_.has_value() && token == *eos_) return FinishReason::kEos;
  if (generated_ >= stopping_.max_new_tokens || prompt_len_ + generated_ > context_) {
    return FinishReason::kLength;
  }
  return FinishReason::kUnspecified;
}

OutputProcessor::Update OutputProcessor::Process(absl::Span<const TokenOutput> tokens,
                                                 GenerationChunk* chunk) {
  Update u;
  for (const TokenOutput& t : tokens) {
    chunk->tokens.push_back(t);
    ++generated_;
    ++u.accepted;
    if (detok_ != nullptr) {
      // Models often pad their vocabulary beyond the tokenizer's: such ids have no text.
      absl::StatusOr<std::string> piece =
          tokenizer_->TokenBytes(t.token).has_value() ? detok_->Push(t.token) : std::string();
      if (!piece.ok()) {
        u.reason = FinishReason::kError;
        u.error = piece.status();
        return u;
      }
      std::string text = stop_->Push(*piece);
      if (text_) chunk->text += text;
      if (stop_->matched()) {
        stop_string_matched_ = true;
        u.reason = FinishReason::kStopString;
        return u;
      }
    }
    u.reason = StopAt(t.token);
    if (u.reason != FinishReason::kUnspecified) return u;
  }
  return u;
}

void OutputProcessor::Finish(FinishReason reason, absl::Status error, GenerationChunk* chunk) {
  if (stop_ != nullptr && !stop_string_matched_) {
    std::string rest = stop_->Push(detok_->Finish());
    rest += stop_->Flush();
    if (text_) chunk->text += rest;
  }
  if (!text_) chunk->text.clear();
  chunk->finished = true;
  chunk->finish_reason = reason;
  chunk->error = std::move(error);
  chunk->usage.prompt_tokens = prompt_len_;
  chunk->usage.generated_tokens = generated_;
}

}  // namespace dcf
