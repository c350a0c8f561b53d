#include "engine/kv/block_allocator.h"

#include "absl/strings/str_cat.h"
#include "engine/common/logging.h"

namespace dcf {

BlockAllocator::BlockAllocator(int num_blocks)
    : refcount_(num_blocks, 0),
      prev_(num_blocks, -1),
      next_(num_blocks, -1),
      hash_(num_blocks),
      has_hash_(num_blocks, 0) {
  for (int32_t b = 0; b < num_blocks; ++b) PushBack(b);
}

void BlockAllocator::Unlink(int32_t b) {
  const int q = has_hash_[b];
  if (prev_[b] >= 0) {
    next_[prev_[b]] = next_[b];
  } else {
    head_[q] = next_[b];
  }
  if (next_[b] >= 0) {
    prev_[next_[b]] = prev_[b];
  } else {
    tail_[q] = prev_[b];
  }
  prev_[b] = next_[b] = -1;
  --num_free_;
}

void BlockAllocator::PushBack(int32_t b) {
  const int q = has_hash_[b];
  prev_[b] = tail_[q];
  next_[b] = -1;
  if (tail_[q] >= 0) {
    next_[tail_[q]] = b;
  } else {
    head_[q] = b;
  }
  tail_[q] = b;
  ++num_free_;
}

std::optional<int32_t> BlockAllocator::Allocate() {
  // A block without a hash first: taking it evicts nothing.
  const int32_t b = head_[0] >= 0 ? head_[0] : head_[1];
  if (b < 0) return std::nullopt;
  Unlink(b);
  if (has_hash_[b]) {
    cached_.erase(hash_[b]);
    has_hash_[b] = 0;
    ++evictions_;
  }
  refcount_[b] = 1;
  return b;
}

void BlockAllocator::AddRef(int32_t block) {
  DCF_CHECK(block >= 0 && block < num_blocks()) << "bad block id " << block;
  if (refcount_[block] == 0) {
    DCF_CHECK(has_hash_[block]) << "AddRef on free block " << block << " that is not cached";
    Unlink(block);
  }
  ++refcount_[block];
}

void BlockAllocator::Release(int32_t block) {
  DCF_CHECK(block >= 0 && block < num_blocks()) << "bad block id " << block;
  DCF_CHECK(refcount_[block] > 0) << "double free of block " << block;
  if (--refcount_[block] == 0) PushBack(block);
}

bool BlockAllocator::Cache(int32_t block, const BlockHash& hash) {
  DCF_CHECK(block >= 0 && block < num_blocks()) << "bad block id " << block;
  DCF_CHECK(refcount_[block] > 0) << "Cache on free block " << block;
  if (has_hash_[block]) return hash_[block] == hash;
  if (!cached_.emplace(hash, block).second) return false;
  hash_[block] = hash;
  has_hash_[block] = 1;
  return true;
}

std::optional<int32_t> BlockAllocator::Lookup(const BlockHash& hash) const {
  auto it = cached_.find(hash);
  if (it == cached_.end()) return std::nullopt;
  return it->second;
}

absl::Status BlockAllocator::Validate() const {
  const int n = num_blocks();
  std::vector<uint8_t> seen(n, 0);
  int count = 0;
  for (int q = 0; q < 2; ++q) {
    int32_t last = -1;
    for (int32_t b = head_[q]; b >= 0; b = next_[b]) {
      if (b >= n || seen[b]) return absl::InternalError(absl::StrCat("free queue loops at ", b));
      if (prev_[b] != last) return absl::InternalError(absl::StrCat("free queue link at ", b));
      if (refcount_[b] != 0) {
        return absl::InternalError(absl::StrCat("block ", b, " is free with refcount ",
                                                refcount_[b]));
      }
      if (has_hash_[b] != q) {
        return absl::InternalError(absl::StrCat("block ", b, " is in the ",
                                                q ? "cached" : "uncached", " free queue"));
      }
      seen[b] = 1;
      last = b;
      ++count;
    }
    if (last != tail_[q]) return absl::InternalError(absl::StrCat("free queue ", q, " tail"));
  }
  if (count != num_free_) {
    return absl::InternalError(absl::StrCat("free queue holds ", count, " blocks, counted ",
                                            num_free_));
  }
  int hashed = 0;
  for (int32_t b = 0; b < n; ++b) {
    if (refcount_[b] < 0) return absl::InternalError(absl::StrCat("negative refcount at ", b));
    if (refcount_[b] == 0 && !seen[b]) {
      return absl::InternalError(absl::StrCat("block ", b, " has refcount 0 but is not free"));
    }
    if (has_hash_[b]) {
      ++hashed;
      auto it = cached_.find(hash_[b]);
      if (it == cached_.end() || it->second != b) {
        return absl::InternalError(absl::StrCat("block ", b, "'s hash maps elsewhere"));
      }
    }
  }
  if (hashed != static_cast<int>(cached_.size())) {
    return absl::InternalError(absl::StrCat(cached_.size(), " hashes for ", hashed,
                                            " cached blocks"));
  }
  return absl::OkStatus();
}

}  // namespace dcf
