#include "engine/model/sequence_runner.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"

namespace dcf {

absl::StatusOr<std::unique_ptr<SequenceRunner>> SequenceRunner::Create(Backend* backend,
                                                                       int block_size) {
  const ModelConfig& c = backend->config();
  KvCacheShape shape;
  shape.block_size = block_size;
  shape.window = c.window_size;
  const int context_blocks = (c.max_positions + block_size - 1) / block_size;
  shape.num_blocks[static_cast<int>(LayerGroup::kGlobal)] = context_blocks;
  shape.num_blocks[static_cast<int>(LayerGroup::kWindow)] = context_blocks;
  RETURN_IF_ERROR(backend->AllocateCache(shape));
  return std::unique_ptr<SequenceRunner>(
      new SequenceRunner(backend, std::make_unique<KvCacheManager>(shape)));
}

absl::Status SequenceRunner::Append(absl::Span<const int32_t> tokens, int chunk,
                                    std::vector<float>* logits) {
  if (chunk <= 0) return absl::InvalidArgumentError("chunk must be positive");
  if (tokens.empty()) return absl::OkStatus();
  const int V = backend_->config().vocab_size;
  std::vector<float> step_logits;
  for (size_t i = 0; i < tokens.size(); i += chunk) {
    const auto piece = tokens.subspan(i, std::min<size_t>(chunk, tokens.size() - i));
    const int new_len = seq_.num_tokens + static_cast<int>(piece.size());
    if (new_len > backend_->config().max_positions) {
      return absl::OutOfRangeError(absl::StrCat("sequence of ", new_len,
                                                " tokens exceeds the model context of ",
                                                backend_->config().max_positions));
    }
    RETURN_IF_ERROR(manager_->Reserve(seq_, new_len));
    ForwardSpan span{&seq_, seq_.num_tokens, piece, logits != nullptr};
    step_logits.resize(static_cast<size_t>(NumLogitRows({&span, 1})) * V);
    RETURN_IF_ERROR(backend_->Forward({&span, 1}, absl::MakeSpan(step_logits)));
    manager_->Commit(seq_, new_len);
    if (logits != nullptr) logits->insert(logits->end(), step_logits.begin(), step_logits.end());
  }
  last_logits_.assign(step_logits.end() - V, step_logits.end());
  return absl::OkStatus();
}

absl::StatusOr<GreedyResult> SequenceRunner::Greedy(absl::Span<const int32_t> prompt,
                                                    int max_new_tokens, int chunk,
                                                    std::optional<int32_t> eos) {
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  RETURN_IF_ERROR(Append(prompt, chunk));
  GreedyResult out;
  while (static_cast<int>(out.tokens.size()) < max_new_tokens) {
    const int32_t next = ArgMax(last_logits_);
    out.tokens.push_back(next);
    out.logprobs.push_back(LogSoftmaxAt(last_logits_, next));
    if (eos.has_value() && next == *eos) break;
    if (static_cast<int>(out.tokens.size()) == max_new_tokens) break;
    // The model context is full: stop with what was generated (like max_new_tokens).
    if (seq_.num_tokens + 1 > backend_->config().max_positions) break;
    RETURN_IF_ERROR(Append({&next, 1}, 1));
  }
  return out;
}

void SequenceRunner::Reset() { manager_->Free(seq_); }

int32_t ArgMax(absl::Span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

float LogSoftmaxAt(absl::Span<const float> logits, int32_t index) {
  const float mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float v : logits) sum += std::exp(static_cast<double>(v) - mx);
  return static_cast<float>(logits[index] - mx - std::log(sum));
}

}  // namespace dcf
