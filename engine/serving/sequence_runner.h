// Runs one sequence through a backend with its own small paged cache: the offline
// generation path (dcformer-generate) and the reference path the tests compare against.
// Not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kv/kv_cache_manager.h"
#include "engine/execution/backend.h"

namespace dcf {

struct GreedyResult {
  std::vector<int32_t> tokens;    // generated ids
  std::vector<float> logprobs;    // natural-log softmax probability of each token
  // Wall time of the prompt's steps (the last of which samples tokens[0]), and of each decode
  // step after it (one token in, tokens[i + 1] out; tokens.size() - 1 of them), each timed
  // around its own Backend::Step (benchmarks).
  double prompt_seconds = 0;
  std::vector<double> decode_step_seconds;
};

class SequenceRunner {
 public:
  // Prepares the backend for one sequence of the model's full context and allocates a cache
  // that holds it. Replaces any workspace and cache the backend had. `max_draft_rows` > 0
  // lets steps verify up to that many drafted tokens (StepBatch::sample_rows; the decode
  // bench's verify cost), where the backend VerifiesDrafts(); the sampler's workspace grows
  // with it (a row of the vocabulary per draft on cuda), so only a caller that verifies asks.
  static absl::StatusOr<std::unique_ptr<SequenceRunner>> Create(Backend* backend,
                                                                int block_size = 16,
                                                                int max_draft_rows = 0);

  // Appends `tokens`, feeding them in chunks of at most `chunk` tokens. When `logits` is not
  // null, the logits of every appended token are appended to it ([n, vocab] f32).
  absl::Status Append(absl::Span<const int32_t> tokens, int chunk,
                      std::vector<float>* logits = nullptr);

  // Greedy decoding (the backend's sampler at temperature 0): feeds `prompt` (chunked), then
  // takes the argmax token until the serving engine's stop rules end it (OutputProcessor):
  // `max_new_tokens`, a token equal to `eos` (which is included), or a full model context
  // (the last token is the one sampled at the context's last position). OutOfRange when the
  // prompt alone does not fit the context; Internal when the logits are not finite.
  absl::StatusOr<GreedyResult> Greedy(absl::Span<const int32_t> prompt, int max_new_tokens,
                                      int chunk, std::optional<int32_t> eos = std::nullopt);

  // Drops the sequence (frees its blocks).
  void Reset();

  int num_tokens() const { return seq_.num_tokens; }
  const SequenceKv& kv() const { return seq_; }
  const KvCacheManager& cache() const { return *manager_; }

 private:
  SequenceRunner(Backend* backend, std::unique_ptr<KvCacheManager> manager, int blocks_per_seq)
      : backend_(backend), manager_(std::move(manager)), blocks_per_seq_(blocks_per_seq) {}

  // Runs `tokens` as one step; samples greedily from the last row when `sample`, returns all
  // rows' logits in out_.logits when `logits`.
  absl::Status RunStep(absl::Span<const int32_t> tokens, bool sample, bool logits);

  Backend* backend_;
  std::unique_ptr<KvCacheManager> manager_;
  const int blocks_per_seq_;
  SequenceKv seq_;
  StepBatch batch_;
  StepOutput out_;
};

}  // namespace dcf
