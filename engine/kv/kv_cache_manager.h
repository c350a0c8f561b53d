// Paged KV-cache bookkeeping for all sequences: two layer groups (global, window), each with
// its own block pool and a block table per sequence. Pure logic over ids; the backend owns
// the memory the ids index.
//
// Position p of a sequence lives in logical block p / B, slot p % B. Window layers only keep
// the keys future queries can see: after a sequence holds n tokens, the next query (at n)
// sees p > n - W, so every window block wholly below n - W + 1 is freed (its table entry
// becomes kNoBlock). A window group therefore holds at most ceil(W/B) + 1 blocks per sequence
// between steps and during decode. No ring buffer: tables only ever drop their front.
//
// Not thread-safe: owned by the engine loop thread.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/kv/block_allocator.h"
#include "engine/model/model_config.h"

namespace dcf {

inline constexpr int32_t kNoBlock = -1;

// First position a sequence of `num_tokens` tokens must still keep in a layer group: 0 for
// global layers (window <= 0), num_tokens - W + 1 for a window of W (the next query, at
// num_tokens, sees p > num_tokens - W).
inline int FirstKeptPosition(int window, int num_tokens) {
  return window > 0 && num_tokens - window + 1 > 0 ? num_tokens - window + 1 : 0;
}

// The cache state of one sequence. Owned by whoever owns the sequence; every block must be
// returned with KvCacheManager::Free before it is destroyed.
struct SequenceKv {
  int num_tokens = 0;  // positions [0, num_tokens) have been computed
  // blocks[g][i]: physical block of logical block i in group g, or kNoBlock.
  std::array<std::vector<int32_t>, kNumLayerGroups> blocks;

  int HeldBlocks(LayerGroup g) const;
};

struct KvCacheShape {
  int block_size = 16;                                // B, tokens per block
  std::array<int, kNumLayerGroups> num_blocks{0, 0};  // pool size per group
  int window = 0;                                     // W of the window group (0: none)
};

// Blocks each layer group needs so that one sequence of `max_len` tokens can run alone in a
// pool of this shape: ceil(max_len/B) in the global group; in the window group the window
// bound ceil(W/B) + 1 (see WindowBlockBound) plus the one block a step may add before Commit
// frees the oldest (the scheduler shrinks prefill chunks to what fits), but never more than
// the global count. The one rule behind "can this request ever run" (Engine::Enqueue) and
// "does the pool hold one full-context sequence" (PlanKvCache). Pure, thread-safe.
std::array<int, kNumLayerGroups> BlocksToRunAlone(const KvCacheShape& shape, int max_len);
// True when BlocksToRunAlone(shape, max_len) fits the pool sizes of `shape`.
bool FitsPoolAlone(const KvCacheShape& shape, int max_len);

class KvCacheManager {
 public:
  explicit KvCacheManager(const KvCacheShape& shape);

  const KvCacheShape& shape() const { return shape_; }
  int block_size() const { return shape_.block_size; }

  // First position a sequence of `num_tokens` tokens still keeps in group `g`.
  int FirstKeptPosition(LayerGroup g, int num_tokens) const;

  // New blocks group `g` needs for `seq` to hold positions up to `new_len` (exclusive),
  // given it writes only positions >= FirstKeptPosition(g, new_len).
  int BlocksNeeded(const SequenceKv& seq, LayerGroup g, int new_len) const;
  bool CanReserve(const SequenceKv& seq, int new_len) const;

  // Allocates the blocks for writing positions [seq.num_tokens, new_len). On
  // ResourceExhausted nothing was allocated.
  absl::Status Reserve(SequenceKv& seq, int new_len);

  // Marks positions up to `new_len` computed and frees window blocks no future query sees.
  void Commit(SequenceKv& seq, int new_len);

  // Returns every block of `seq` and resets it to empty.
  void Free(SequenceKv& seq);

  const BlockAllocator& allocator(LayerGroup g) const { return pools_[static_cast<int>(g)]; }
  int num_free(LayerGroup g) const { return allocator(g).num_free(); }
  int num_used(LayerGroup g) const { return allocator(g).num_used(); }

  // Upper bound of window blocks per sequence between steps: ceil(W/B) + 1.
  int WindowBlockBound() const;

 private:
  void ReleaseBelow(SequenceKv& seq, LayerGroup g, int first_kept);

  KvCacheShape shape_;
  std::array<BlockAllocator, kNumLayerGroups> pools_;
};

}  // namespace dcf
