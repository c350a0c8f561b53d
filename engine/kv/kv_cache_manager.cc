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

KvCacheManager::KvCacheManager(const KvCacheShape& shape, bool prefix_caching)
    : shape_(shape),
      prefix_caching_(prefix_caching),
      pools_{BlockAllocator(shape.num_blocks[0]), BlockAllocator(shape.num_blocks[1])} {
  DCF_CHECK(shape.block_size > 0);
}

int KvCacheManager::FirstKeptPosition(LayerGroup g, int num_tokens) const {
  return dcf::FirstKeptPosition(g == LayerGroup::kWindow ? shape_.window : 0, num_tokens);
}

int KvCacheManager::FirstWritten(const SequenceKv& seq, LayerGroup g, int new_len) const {
  if (prefix_caching_) return seq.num_tokens;
  return std::max(seq.num_tokens, FirstKeptPosition(g, new_len));
}

int KvCacheManager::BlocksNeeded(const SequenceKv& seq, LayerGroup g, int new_len) const {
  const int B = shape_.block_size;
  const auto& table = seq.blocks[static_cast<int>(g)];
  int needed = 0;
  for (int blk = FirstWritten(seq, g, new_len) / B; blk * B < new_len; ++blk) {
    if (blk >= static_cast<int>(table.size()) || table[blk] == kNoBlock) ++needed;
  }
  return needed;
}

int KvCacheManager::BlocksToHold(const SequenceKv& seq, LayerGroup g, int len) const {
  const int B = shape_.block_size;
  const auto& table = seq.blocks[static_cast<int>(g)];
  int needed = 0;
  for (int blk = std::max(seq.num_tokens, FirstKeptPosition(g, len)) / B; blk * B < len; ++blk) {
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
    const int first = FirstWritten(seq, static_cast<LayerGroup>(g), new_len);
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

void KvCacheManager::Commit(SequenceKv& seq, int new_len, absl::Span<const int32_t> tokens) {
  const int B = shape_.block_size;
  const int old_full = seq.num_tokens / B;
  seq.num_tokens = new_len;
  if (prefix_caching_) {
    DCF_CHECK(static_cast<int>(tokens.size()) >= new_len)
        << "Commit of " << new_len << " tokens with " << tokens.size() << " token ids";
    HashBlocks(seq, tokens.subspan(0, new_len));
    for (int blk = old_full; blk < new_len / B; ++blk) {
      for (int g = 0; g < kNumLayerGroups; ++g) {
        const auto& table = seq.blocks[g];
        if (blk < static_cast<int>(table.size()) && table[blk] != kNoBlock) {
          pools_[g].Cache(table[blk], seq.block_hashes[blk]);
        }
      }
    }
  }
  ReleaseBelow(seq, LayerGroup::kWindow, FirstKeptPosition(LayerGroup::kWindow, new_len));
}

void KvCacheManager::ReleaseUncommitted(SequenceKv& seq) {
  const int B = shape_.block_size;
  const int keep = (seq.num_tokens + B - 1) / B;  // blocks holding a committed position
  for (int g = 0; g < kNumLayerGroups; ++g) {
    auto& table = seq.blocks[g];
    for (int blk = static_cast<int>(table.size()) - 1; blk >= keep; --blk) {
      if (table[blk] != kNoBlock) pools_[g].Release(table[blk]);
    }
    if (static_cast<int>(table.size()) > keep) table.resize(keep);
  }
}

void KvCacheManager::Free(SequenceKv& seq) {
  for (int g = 0; g < kNumLayerGroups; ++g) {
    // Last to first: the free queue then evicts a sequence's tail before its prefix, the
    // part other requests are likelier to share.
    for (auto it = seq.blocks[g].rbegin(); it != seq.blocks[g].rend(); ++it) {
      if (*it != kNoBlock) pools_[g].Release(*it);
    }
    seq.blocks[g].clear();
  }
  seq.num_tokens = 0;
}

void KvCacheManager::HashBlocks(SequenceKv& seq, absl::Span<const int32_t> tokens) const {
  if (!prefix_caching_) return;
  const int B = shape_.block_size;
  const int full = static_cast<int>(tokens.size()) / B;
  for (int i = static_cast<int>(seq.block_hashes.size()); i < full; ++i) {
    const BlockHash& parent = i == 0 ? seq.hash_root : seq.block_hashes[i - 1];
    const absl::Span<const int32_t> block = tokens.subspan(static_cast<size_t>(i) * B, B);
    // A negative id is a placeholder of a token still being sampled (pipelined steps): a
    // block named by it would be reused with the wrong rows.
    DCF_CHECK(std::all_of(block.begin(), block.end(), [](int32_t t) { return t >= 0; }))
        << "hashing block " << i << ", which holds a token not sampled yet";
    seq.block_hashes.push_back(HashBlock(parent, block));
  }
}

PrefixHit KvCacheManager::FindCachedPrefix(SequenceKv& seq,
                                           absl::Span<const int32_t> tokens) const {
  PrefixHit hit;
  if (!prefix_caching_ || tokens.empty()) return hit;
  DCF_CHECK(seq.num_tokens == 0 && seq.blocks[0].empty() && seq.blocks[1].empty())
      << "prefix lookup for a sequence that holds blocks";
  HashBlocks(seq, tokens);
  const int B = shape_.block_size;
  // At least one token is left to compute, whose logits give the next token.
  const int max_blocks = (static_cast<int>(tokens.size()) - 1) / B;
  const BlockAllocator& global = allocator(LayerGroup::kGlobal);
  const BlockAllocator& window = allocator(LayerGroup::kWindow);
  std::vector<int32_t> global_blocks;
  for (int i = 0; i < max_blocks; ++i) {
    const std::optional<int32_t> b = global.Lookup(seq.block_hashes[i]);
    if (!b.has_value()) break;
    global_blocks.push_back(*b);
  }
  // Window group, right to left from the global hit: the largest end <= global hit whose
  // blocks [first_needed(end), end) are all cached. An uncached block j rules out every end
  // above j, so the scan moves end down to j and goes on below it: linear in the hit.
  const auto first_needed = [&](int end) {
    return FirstKeptPosition(LayerGroup::kWindow, end * B) / B;
  };
  int end = static_cast<int>(global_blocks.size());
  for (int j = end - 1; j >= first_needed(end); --j) {
    if (!window.Lookup(seq.block_hashes[j]).has_value()) end = j;
  }
  if (end == 0) return hit;
  hit.num_tokens = end * B;
  auto& g_table = hit.blocks[static_cast<int>(LayerGroup::kGlobal)];
  g_table.assign(global_blocks.begin(), global_blocks.begin() + end);
  auto& w_table = hit.blocks[static_cast<int>(LayerGroup::kWindow)];
  w_table.assign(end, kNoBlock);
  for (int j = first_needed(end); j < end; ++j) w_table[j] = *window.Lookup(seq.block_hashes[j]);
  return hit;
}

std::array<int, kNumLayerGroups> KvCacheManager::BlocksToAdmit(const SequenceKv& seq,
                                                               const PrefixHit& hit,
                                                               int len) const {
  DCF_CHECK(seq.num_tokens == 0) << "admission of a sequence that holds blocks";
  const int B = shape_.block_size;
  std::array<int, kNumLayerGroups> out{0, 0};
  for (int g = 0; g < kNumLayerGroups; ++g) {
    const auto& table = hit.blocks[g];
    for (int32_t b : table) {
      if (b != kNoBlock && pools_[g].refcount(b) == 0) ++out[g];
    }
    const int first = std::max(hit.num_tokens, FirstKeptPosition(static_cast<LayerGroup>(g), len));
    for (int blk = first / B; blk * B < len; ++blk) {
      if (blk >= static_cast<int>(table.size()) || table[blk] == kNoBlock) ++out[g];
    }
  }
  return out;
}

void KvCacheManager::AcquirePrefix(SequenceKv& seq, const PrefixHit& hit) {
  DCF_CHECK(seq.num_tokens == 0 && seq.blocks[0].empty() && seq.blocks[1].empty())
      << "prefix hit for a sequence that holds blocks";
  if (hit.num_tokens == 0) return;
  for (int g = 0; g < kNumLayerGroups; ++g) {
    for (int32_t b : hit.blocks[g]) {
      if (b != kNoBlock) pools_[g].AddRef(b);
    }
    seq.blocks[g] = hit.blocks[g];
  }
  seq.num_tokens = hit.num_tokens;
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
