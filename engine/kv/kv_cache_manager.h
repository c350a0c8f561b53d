// Paged KV-cache bookkeeping for all sequences: two layer groups (global, window), each with
// its own block pool and a block table per sequence, and the prefix cache over both. Pure
// logic over ids; the backend owns the memory the ids index.
//
// Position p of a sequence lives in logical block p / B, slot p % B. Window layers only keep
// the keys future queries can see: after a sequence holds n tokens, the next query (at n)
// sees p > n - W, so every window block wholly below n - W + 1 is freed (its table entry
// becomes kNoBlock). A window group therefore holds at most ceil(W/B) + 1 blocks per sequence
// between steps and during decode. No ring buffer: tables only ever drop their front.
//
// What a step writes is what its tables hold: a backend writes each new row into the block
// its table names for that position, in every group, and nothing where the entry is kNoBlock
// (step_batch.h). Without prefix caching Reserve gives a window group only the blocks of the
// positions kept after the step (a long prefill chunk's early rows are computed but not
// stored). With prefix caching it gives every new position a block in every group, so that
// every block is written whole and can be named by its hash; Commit then frees the window
// blocks that fell out of the window, and they stay cached.
//
// Prefix caching (vLLM's automatic prefix caching, with its hybrid rule for window layers):
//  * Every full block of a sequence's tokens is named by a chained hash (block_hash.h)
//    rooted in the request's cache_salt; sequences with different salts never share.
//  * Commit registers each block that became full and is in a table (its rows are written
//    and its tokens committed) under its hash in that group's pool. A block released by
//    every sequence keeps its hash and joins the pool's free queue: it counts as free, and
//    Allocate evicts the least recently released one first (block_allocator.h). Free
//    releases a sequence's blocks last to first, so its tail goes before its prefix.
//  * FindCachedPrefix gives a new sequence the longest hit: the largest block-aligned length
//    h <= num_tokens - 1 (one token is always left to compute: the last block, full or
//    partial, is never taken from the cache) such that the global group holds every block
//    of [0, h) and the window group the blocks of [h - W + 1, h), the keys a query at h
//    sees. Global blocks are matched left to right, window blocks right to left from the
//    global hit, and the hit is where both hold (the window group needs nothing of a block
//    wholly below h - W + 1, so its evicted early blocks do not matter).
//  * AcquirePrefix references the hit's blocks (a running sequence's block is never
//    evicted), fills the tables and sets num_tokens = h: prefill continues at h, exactly as
//    a prefill split at h would (every row of [0, h) is the one the sequence would compute).
//
// Not thread-safe: owned by the engine loop thread.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/kv/block_allocator.h"
#include "engine/kv/block_hash.h"
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
  // Prefix caching: the chain's root (SaltRoot of the request's cache_salt; set before the
  // sequence is scheduled) and block_hashes[i], the hash of the full block i of its known
  // tokens. They depend on the tokens only, so Free keeps them.
  BlockHash hash_root;
  std::vector<BlockHash> block_hashes;

  int HeldBlocks(LayerGroup g) const;
};

// A prefix-cache hit for a new sequence (KvCacheManager::FindCachedPrefix): positions
// [0, num_tokens) are cached in `blocks` (per group, logical block i's physical block, or
// kNoBlock for window blocks below the window of num_tokens). Empty: no hit.
struct PrefixHit {
  int num_tokens = 0;  // a multiple of the block size
  std::array<std::vector<int32_t>, kNumLayerGroups> blocks;
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
  explicit KvCacheManager(const KvCacheShape& shape, bool prefix_caching = false);

  const KvCacheShape& shape() const { return shape_; }
  int block_size() const { return shape_.block_size; }
  bool prefix_caching() const { return prefix_caching_; }

  // First position a sequence of `num_tokens` tokens still keeps in group `g`.
  int FirstKeptPosition(LayerGroup g, int num_tokens) const;

  // New blocks Reserve(seq, new_len) takes from group `g`: the blocks of the positions
  // [seq.num_tokens, new_len) it writes (see the header comment) that `seq` lacks.
  int BlocksNeeded(const SequenceKv& seq, LayerGroup g, int new_len) const;
  bool CanReserve(const SequenceKv& seq, int new_len) const;
  // New blocks group `g` needs for `seq` to hold the positions a sequence of `len` tokens
  // keeps (>= FirstKeptPosition(g, len)): what it holds once they are computed.
  int BlocksToHold(const SequenceKv& seq, LayerGroup g, int len) const;

  // Allocates the blocks for writing positions [seq.num_tokens, new_len). On
  // ResourceExhausted nothing was allocated.
  absl::Status Reserve(SequenceKv& seq, int new_len);

  // Marks positions up to `new_len` computed and frees window blocks no future query sees.
  // With prefix caching, first registers each block that became full under its hash;
  // `tokens` are the sequence's tokens (at least new_len of them; ignored without caching).
  // Only blocks wholly below new_len are ever registered, so blocks reserved for positions
  // past it (tokens a caller may still take back) stay unnamed.
  void Commit(SequenceKv& seq, int new_len, absl::Span<const int32_t> tokens = {});

  // Speculative decoding's rollback, after Commit: releases every block of `seq` that holds
  // no position below seq.num_tokens (reserved for drafted tokens that were rejected; never
  // named, since Commit names only blocks below the committed length), in both groups.
  void ReleaseUncommitted(SequenceKv& seq);

  // Returns every block of `seq` (last to first; cached blocks stay cached) and resets its
  // tables and num_tokens. Its hashes are kept.
  void Free(SequenceKv& seq);

  // --- Prefix caching (no-ops, and empty hits, without it) ---

  // Hashes every full block of `tokens` (the sequence's known tokens, a prefix of what it
  // will hold: tokens only grow) that seq.block_hashes lacks. A negative id in such a block
  // (a placeholder of a token not sampled yet) aborts: a bug of the caller.
  void HashBlocks(SequenceKv& seq, absl::Span<const int32_t> tokens) const;
  // The longest hit for empty `seq` (no blocks, num_tokens 0) whose known tokens are
  // `tokens` (at least 1); hashes them first. See the header comment for the rule.
  PrefixHit FindCachedPrefix(SequenceKv& seq, absl::Span<const int32_t> tokens) const;
  // Free blocks per group that admitting empty `seq` at `hit` takes from the pools so that
  // it holds what a sequence of `len` tokens keeps: the hit's blocks that are free now
  // (cached, not in use) plus BlocksToHold from the hit. With an empty hit, BlocksToHold.
  std::array<int, kNumLayerGroups> BlocksToAdmit(const SequenceKv& seq, const PrefixHit& hit,
                                                 int len) const;
  // Gives empty `seq` the hit: references its blocks, copies its tables, sets num_tokens.
  void AcquirePrefix(SequenceKv& seq, const PrefixHit& hit);

  const BlockAllocator& allocator(LayerGroup g) const { return pools_[static_cast<int>(g)]; }
  int num_free(LayerGroup g) const { return allocator(g).num_free(); }  // cached-free included
  int num_used(LayerGroup g) const { return allocator(g).num_used(); }
  int num_cached(LayerGroup g) const { return allocator(g).num_cached(); }
  int64_t num_evictions(LayerGroup g) const { return allocator(g).num_evictions(); }

  // Upper bound of window blocks per sequence between steps: ceil(W/B) + 1.
  int WindowBlockBound() const;

 private:
  // First position of [seq.num_tokens, new_len) that Reserve gives a block in group `g`.
  int FirstWritten(const SequenceKv& seq, LayerGroup g, int new_len) const;
  void ReleaseBelow(SequenceKv& seq, LayerGroup g, int first_kept);

  KvCacheShape shape_;
  bool prefix_caching_;
  std::array<BlockAllocator, kNumLayerGroups> pools_;
};

}  // namespace dcf
