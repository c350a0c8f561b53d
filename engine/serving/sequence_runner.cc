#include "engine/serving/sequence_runner.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/serving/output_processor.h"

namespace dcf {

absl::StatusOr<std::unique_ptr<SequenceRunner>> SequenceRunner::Create(Backend* backend,
                                                                       int block_size,
                                                                       int max_draft_rows) {
  if (block_size <= 0) return absl::InvalidArgumentError("block_size must be positive");
  const ModelConfig& c = backend->config();
  const int context_blocks = (c.max_positions + block_size - 1) / block_size;
  StepLimits limits;
  limits.max_tokens = c.max_positions;
  limits.max_seqs = 1;
  limits.max_logit_rows = c.max_positions;
  limits.blocks_per_seq = context_blocks;
  limits.num_penalty_slots = 0;
  // Steps that verify drafts (the decode bench's verify cost), where the backend can.
  limits.max_draft_rows =
      backend->VerifiesDrafts() ? std::clamp(max_draft_rows, 0, c.max_positions) : 0;
  RETURN_IF_ERROR(backend->Prepare(limits).status());
  KvCacheShape shape;
  shape.block_size = block_size;
  shape.window = c.window_size;
  shape.num_blocks[static_cast<int>(LayerGroup::kGlobal)] = context_blocks;
  shape.num_blocks[static_cast<int>(LayerGroup::kWindow)] = context_blocks;
  RETURN_IF_ERROR(backend->AllocateCache(shape));
  return std::unique_ptr<SequenceRunner>(
      new SequenceRunner(backend, std::make_unique<KvCacheManager>(shape), context_blocks));
}

absl::Status SequenceRunner::RunStep(absl::Span<const int32_t> tokens, bool sample,
                                     bool logits) {
  const int new_len = seq_.num_tokens + static_cast<int>(tokens.size());
  if (new_len > backend_->config().max_positions) {
    return absl::OutOfRangeError(absl::StrCat("sequence of ", new_len,
                                              " tokens exceeds the model context of ",
                                              backend_->config().max_positions));
  }
  RETURN_IF_ERROR(manager_->Reserve(seq_, new_len));
  SamplingRow row;
  row.params.temperature = 0;
  row.logprob = true;
  batch_.Reset(blocks_per_seq_);
  batch_.AddSequence(tokens, seq_, sample, row, logits);
  RETURN_IF_ERROR(backend_->Step(batch_, &out_));
  manager_->Commit(seq_, new_len);
  return absl::OkStatus();
}

absl::Status SequenceRunner::Append(absl::Span<const int32_t> tokens, int chunk,
                                    std::vector<float>* logits) {
  if (chunk <= 0) return absl::InvalidArgumentError("chunk must be positive");
  for (size_t i = 0; i < tokens.size(); i += chunk) {
    const auto piece = tokens.subspan(i, std::min<size_t>(chunk, tokens.size() - i));
    RETURN_IF_ERROR(RunStep(piece, /*sample=*/false, /*logits=*/logits != nullptr));
    if (logits != nullptr) logits->insert(logits->end(), out_.logits.begin(), out_.logits.end());
  }
  return absl::OkStatus();
}

absl::StatusOr<GreedyResult> SequenceRunner::Greedy(absl::Span<const int32_t> prompt,
                                                    int max_new_tokens, int chunk,
                                                    std::optional<int32_t> eos) {
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  if (chunk <= 0) return absl::InvalidArgumentError("chunk must be positive");
  GreedyResult out;
  if (max_new_tokens <= 0) {
    RETURN_IF_ERROR(Append(prompt, chunk));
    return out;
  }
  // The stop rules of the serving engine: EOS, max_new_tokens, the model context.
  StoppingCriteria stopping;
  stopping.max_new_tokens = max_new_tokens;
  OutputOptions output;
  output.text = false;
  OutputProcessor processor(stopping, output, eos, /*tokenizer=*/nullptr,
                            static_cast<int>(prompt.size()), backend_->config().max_positions);
  // The prompt's last chunk samples the first token.
  using Clock = std::chrono::steady_clock;
  const size_t head = (prompt.size() - 1) / chunk * chunk;
  const Clock::time_point p0 = Clock::now();
  RETURN_IF_ERROR(Append(prompt.subspan(0, head), chunk));
  RETURN_IF_ERROR(RunStep(prompt.subspan(head), /*sample=*/true, /*logits=*/false));
  out.prompt_seconds = std::chrono::duration<double>(Clock::now() - p0).count();
  while (true) {
    if (out_.nonfinite[0]) {
      return absl::InternalError(absl::StrCat(
          "the model's logits are not finite (NaN or infinity) at position ", seq_.num_tokens - 1,
          ": its weights may be corrupt (--check-weights scans them at load)"));
    }
    TokenOutput t;
    t.token = out_.tokens[0];
    t.logprob = out_.logprobs[0];
    GenerationChunk emitted;
    const OutputProcessor::Update u = processor.Process({&t, 1}, &emitted);
    out.tokens.push_back(t.token);
    out.logprobs.push_back(t.logprob);
    if (u.reason != FinishReason::kUnspecified) break;
    const Clock::time_point s0 = Clock::now();
    RETURN_IF_ERROR(RunStep({&t.token, 1}, /*sample=*/true, /*logits=*/false));
    out.decode_step_seconds.push_back(std::chrono::duration<double>(Clock::now() - s0).count());
  }
  return out;
}

void SequenceRunner::Reset() { manager_->Free(seq_); }

}  // namespace dcf
