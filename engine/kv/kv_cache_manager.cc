#include "engine/kv/kv_cache_manager.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/common/logging.h"

namespace dcf {

int SequenceKv::HeldBlocks(LayerGroup g) const {
  const auto& table = blocks[static_cast<int>(g)];
  return static_cast<int>(std::count_if(table.begin(), table.end(),
                                        [](int32_t b) { return b != kNoBlock; }));
}

KvCacheManager::KvCacheManager(const KvCacheShape& shape)
    : shape_(shape), pools_{BlockAllocator(shape.num_blocks[0]), BlockAllocator(shape.num_blocks[1])} {
  DCF_CHECK(shape.block_size > 0);
}

int KvCacheManager::FirstKeptPosition(LayerGroup g, int num_tokens) const {
  return dcf::FirstKeptPosition(g == LayerGroup::kWindow ? shape_.window : 0, num_tokens);
}

int KvCacheManager::BlocksNeeded(const SequenceKv& seq, LayerGroup g, int new_len) const {
  const int B = shape_.block_size;
  const auto& table = seq.blocks[static_cast<int>(g)];
  const int first = std::max(seq.num_tokens, FirstKeptPosition(g, new_len));
  int needed = 0;
  for (int blk = first / B; blk * B < new_len; ++blk) {
    if (blk >= static_cast<int>(table.size()) || table[blk] == kNoBlock) ++needed;
  }
  return needed;
}

bool KvCacheManager::CanReserve(const SequenceKv& seq, int new_len) const {
  for (int g = 0; g < kNumLayerGroups; ++g) {
    if (BlocksNeeded(seq, static_cast<LayerGroup>(g), new_len) > pools_[g].num_free()) {
      return false;
    }
  }
  return true;
}

absl::Status KvCacheManager::Reserve(SequenceKv& seq, int new_len) {
  if (!CanReserve(seq, new_len)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache: not enough free blocks for ", new_len, " tokens"));
  }
  const int B = shape_.block_size;
  for (int g = 0; g < kNumLayerGroups; ++g) {
    auto& table = seq.blocks[g];
    const int first = std::max(seq.num_tokens, FirstKeptPosition(static_cast<LayerGroup>(g), new_len));
    const int last_block = (new_len + B - 1) / B;  // exclusive
    if (static_cast<int>(table.size()) < last_block) table.resize(last_block, kNoBlock);
    for (int blk = first / B; blk < last_block; ++blk) {
      if (table[blk] == kNoBlock) table[blk] = *pools_[g].Allocate();
    }
  }
  return absl::OkStatus();
}

void KvCacheManager::ReleaseBelow(SequenceKv& seq, LayerGroup g, int first_kept) {
  const int B = shape_.block_size;
  auto& table = seq.blocks[static_cast<int>(g)];
  // Block i covers [i*B, i*B + B); it is dead when its last position is below first_kept.
  for (int blk = 0; blk < static_cast<int>(table.size()) && (blk + 1) * B <= first_kept; ++blk) {
    if (table[blk] != kNoBlock) {
      pools_[static_cast<int>(g)].Release(table[blk]);
      table[blk] = kNoBlock;
    }
  }
}

void KvCacheManager::Commit(SequenceKv& seq, int new_len) {
  seq.num_tokens = new_len;
  ReleaseBelow(seq, LayerGroup::kWindow, FirstKeptPosition(LayerGroup::kWindow, new_len));
}

void KvCacheManager::Free(SequenceKv& seq) {
  for (int g = 0; g < kNumLayerGroups; ++g) {
    for (int32_t b : seq.blocks[g]) {
      if (b != kNoBlock) pools_[g].Release(b);
    }
    seq.blocks[g].clear();
  }
  seq.num_tokens = 0;
}

int KvCacheManager::WindowBlockBound() const {
  const int B = shape_.block_size;
  return (shape_.window + B - 1) / B + 1;
}

std::array<int, kNumLayerGroups> BlocksToRunAlone(const KvCacheShape& shape, int max_len) {
  const int B = shape.block_size;
  const int global = (max_len + B - 1) / B;
  const int window = shape.window > 0 ? std::min(global, (shape.window + B - 1) / B + 2) : global;
  std::array<int, kNumLayerGroups> out{};
  out[static_cast<int>(LayerGroup::kGlobal)] = global;
  out[static_cast<int>(LayerGroup::kWindow)] = window;
  return out;
}

bool FitsPoolAlone(const KvCacheShape& shape, int max_len) {
  const std::array<int, kNumLayerGroups> need = BlocksToRunAlone(shape, max_len);
  for (int g = 0; g < kNumLayerGroups; ++g) {
    if (need[g] > shape.num_blocks[g]) return false;
  }
  return true;
}

}  // namespace dcf
