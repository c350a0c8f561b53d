#include "engine/kv/block_allocator.h"

#include "engine/common/logging.h"

namespace dcf {

BlockAllocator::BlockAllocator(int num_blocks) : refcount_(num_blocks, 0) {
  free_.reserve(num_blocks);
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

std::optional<int32_t> BlockAllocator::Allocate() {
  if (free_.empty()) return std::nullopt;
  const int32_t b = free_.back();
  free_.pop_back();
  refcount_[b] = 1;
  return b;
}

void BlockAllocator::AddRef(int32_t block) {
  DCF_CHECK(block >= 0 && block < num_blocks()) << "bad block id " << block;
  DCF_CHECK(refcount_[block] > 0) << "AddRef on free block " << block;
  ++refcount_[block];
}

void BlockAllocator::Release(int32_t block) {
  DCF_CHECK(block >= 0 && block < num_blocks()) << "bad block id " << block;
  DCF_CHECK(refcount_[block] > 0) << "double free of block " << block;
  if (--refcount_[block] == 0) free_.push_back(block);
}

}  // namespace dcf
