// The model-execution interface every backend (CPU, CUDA) implements.
//
// One Forward call runs one step for a batch of sequences. Each sequence contributes a span
// of new tokens at its own positions (a prefill chunk or one decode token); spans of
// different lengths mix freely. The KV cache is paged: the caller reserves blocks for the
// new positions (KvCacheManager::Reserve) before the call and commits them after it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/kv/kv_cache_manager.h"
#include "engine/model/model_config.h"

namespace dcf {

struct ForwardSpan {
  const SequenceKv* kv = nullptr;       // block tables; positions < start_pos are cached
  int start_pos = 0;                    // position of tokens[0] (== kv->num_tokens)
  absl::Span<const int32_t> tokens;     // new tokens, ids < vocab_size
  bool all_logits = false;              // logits for every token, else only the last
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual const ModelConfig& config() const = 0;
  // "cpu" or "cuda".
  virtual std::string name() const = 0;
  // Bytes of cache memory one block of group `g` takes (all layers of that group).
  virtual size_t BytesPerBlock(LayerGroup g, int block_size) const = 0;

  // Allocates cache storage for `shape` (discarding any previous cache). Must be called
  // before Forward.
  virtual absl::Status AllocateCache(const KvCacheShape& shape) = 0;

  // Runs the model on `spans`, writes their new K/V/compose terms into the cache blocks the
  // spans' tables name, and stores logits as rows of `logits` ([rows, vocab_size] f32), in
  // span order: every token of a span with all_logits, else its last token. `logits` must
  // hold exactly that many rows. InvalidArgument on bad token ids, positions beyond the
  // model context or missing blocks; nothing is written to the cache then.
  virtual absl::Status Forward(absl::Span<const ForwardSpan> spans, absl::Span<float> logits) = 0;
};

// Number of logits rows Forward produces for `spans`.
int NumLogitRows(absl::Span<const ForwardSpan> spans);

}  // namespace dcf
