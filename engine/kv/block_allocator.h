// A fixed pool of KV-cache block ids with reference counts. Pure bookkeeping: the storage
// the ids index lives in a backend (the CPU backend's KV arrays, CUDA buffers).
//
// Not thread-safe: owned by the engine loop thread.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace dcf {

class BlockAllocator {
 public:
  explicit BlockAllocator(int num_blocks);

  // Takes a free block with refcount 1, lowest id first; nullopt when none is free.
  std::optional<int32_t> Allocate();
  // Adds a reference to an allocated block (prefix sharing).
  void AddRef(int32_t block);
  // Drops one reference; the block returns to the free list when none remain.
  void Release(int32_t block);

  int num_blocks() const { return static_cast<int>(refcount_.size()); }
  int num_free() const { return static_cast<int>(free_.size()); }
  int num_used() const { return num_blocks() - num_free(); }
  int refcount(int32_t block) const { return refcount_[block]; }

 private:
  std::vector<int32_t> refcount_;  // [num_blocks]
  std::vector<int32_t> free_;      // stack of free ids; top = lowest id
};

}  // namespace dcf
