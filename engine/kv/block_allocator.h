// A fixed pool of KV-cache block ids with reference counts, and the prefix cache of one layer
// group: which blocks hold the rows of which block hash (block_hash.h). Pure bookkeeping: the
// storage the ids index lives in a backend (the CPU backend's KV arrays, CUDA buffers).
//
// A block is in use while its reference count is above 0 (the block tables of running
// sequences hold it) and free otherwise. A free block may still be cached (it keeps its
// hash): it can be taken back by a new sequence whose prefix it holds (AddRef), until
// Allocate evicts it. Free blocks wait in two least-recently-released queues, the uncached
// and the cached: Allocate takes the uncached block released longest ago, and only when none
// is free the cached one released longest ago (evicting its hash), so cached blocks live as
// long as the pool's churn allows and a block that holds nothing anyone can reuse (a window
// block past its window, a speculative draft's rejected block) is always taken before one
// that does. Blocks that were never used come first, lowest id first. A block referenced by
// a running sequence is never evicted.
//
// Not thread-safe: owned by the engine loop thread.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "engine/kv/block_hash.h"

namespace dcf {

class BlockAllocator {
 public:
  explicit BlockAllocator(int num_blocks);

  // Takes the uncached free block released longest ago, or when none is free the cached one
  // released longest ago, whose hash is dropped first (an eviction); with refcount 1.
  // nullopt when none is free.
  std::optional<int32_t> Allocate();
  // Adds a reference to a block: one in use (sharing), or a free cached one (a prefix-cache
  // hit), which then leaves the free queue.
  void AddRef(int32_t block);
  // Drops one reference; the block joins the back of the free queue when none remain, and
  // stays cached if it was.
  void Release(int32_t block);

  // Records that in-use `block` holds the rows named `hash`. When another block already
  // holds that hash (two sequences computed the same prefix at once), nothing changes and
  // `block` stays uncached: one block per hash. Returns whether `block` is now cached.
  bool Cache(int32_t block, const BlockHash& hash);
  // The block cached under `hash`, in use or free; nullopt when none.
  std::optional<int32_t> Lookup(const BlockHash& hash) const;

  int num_blocks() const { return static_cast<int>(refcount_.size()); }
  int num_free() const { return num_free_; }  // cached-but-free blocks included
  int num_used() const { return num_blocks() - num_free(); }
  int num_cached() const { return static_cast<int>(cached_.size()); }  // in use or free
  int64_t num_evictions() const { return evictions_; }
  int refcount(int32_t block) const { return refcount_[block]; }
  bool is_cached(int32_t block) const { return has_hash_[block] != 0; }
  const BlockHash& hash(int32_t block) const { return hash_[block]; }  // when is_cached

  // Checks the structure: the free queue holds exactly the blocks with refcount 0, once
  // each; the hash map and the per-block hashes agree. Internal names the first mismatch.
  // O(num_blocks); for tests.
  absl::Status Validate() const;

 private:
  void Unlink(int32_t block);
  void PushBack(int32_t block);

  std::vector<int32_t> refcount_;  // [num_blocks]
  // The free queues, [0] uncached and [1] cached (indexed by has_hash_): doubly linked
  // lists through prev_/next_ ([num_blocks]; -1 ends one). A free block's hash changes only
  // as Allocate takes it, so it never moves between them while free.
  std::vector<int32_t> prev_;
  std::vector<int32_t> next_;
  int32_t head_[2] = {-1, -1};  // released longest ago: the next Allocate of that queue
  int32_t tail_[2] = {-1, -1};
  int num_free_ = 0;
  std::vector<BlockHash> hash_;     // [num_blocks] valid where has_hash_
  std::vector<uint8_t> has_hash_;   // [num_blocks]
  absl::flat_hash_map<BlockHash, int32_t> cached_;
  int64_t evictions_ = 0;
};

}  // namespace dcf
