#include "engine/kv/kv_cache_manager.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/kv_shape.h"

namespace dcf {
namespace {

constexpr LayerGroup kG = LayerGroup::kGlobal;
constexpr LayerGroup kW = LayerGroup::kWindow;

using testing::Shape;

TEST(KvCacheManagerTest, WindowGroupStaysBoundedOverLongGeneration) {
  KvCacheManager kv(Shape(64, 8, /*window=*/6, /*B=*/4));
  EXPECT_EQ(kv.WindowBlockBound(), 3);  // ceil(6/4) + 1
  SequenceKv seq;
  ASSERT_TRUE(kv.Reserve(seq, 5).ok());  // prefill 5 tokens
  kv.Commit(seq, 5);
  for (int n = 5; n < 200; ++n) {  // > 10x the window
    ASSERT_TRUE(kv.Reserve(seq, n + 1).ok()) << n;
    kv.Commit(seq, n + 1);
    ASSERT_LE(seq.HeldBlocks(kW), kv.WindowBlockBound()) << "at " << n + 1;
    ASSERT_EQ(seq.HeldBlocks(kG), (n + 1 + 3) / 4);
    ASSERT_EQ(kv.num_used(kW), seq.HeldBlocks(kW));
    if (n > 64 * 4 - 2) break;
  }
  kv.Free(seq);
  EXPECT_EQ(kv.num_used(kG), 0);
  EXPECT_EQ(kv.num_used(kW), 0);
  EXPECT_EQ(seq.num_tokens, 0);
}

TEST(KvCacheManagerTest, ReserveFailsWithoutSideEffects) {
  KvCacheManager kv(Shape(2, 4, 0));
  SequenceKv a;
  ASSERT_TRUE(kv.Reserve(a, 8).ok());  // 2 blocks of 4
  kv.Commit(a, 8);
  SequenceKv b;
  EXPECT_FALSE(kv.CanReserve(b, 1));
  EXPECT_EQ(kv.Reserve(b, 1).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(kv.num_free(kG), 0);
  kv.Free(a);
  EXPECT_TRUE(kv.CanReserve(b, 8));
  EXPECT_FALSE(kv.CanReserve(b, 9));
}

TEST(KvCacheManagerTest, ChunkLongerThanWindowOnlyAllocatesKeptBlocks) {
  KvCacheManager kv(Shape(16, 16, /*window=*/4, /*B=*/4));
  SequenceKv seq;
  // A 20-token chunk keeps positions >= 17 in the window group: blocks 4 only.
  EXPECT_EQ(kv.BlocksNeeded(seq, kW, 20), 1);
  EXPECT_EQ(kv.BlocksNeeded(seq, kG, 20), 5);
  ASSERT_TRUE(kv.Reserve(seq, 20).ok());
  kv.Commit(seq, 20);
  EXPECT_EQ(seq.HeldBlocks(kW), 1);
  kv.Free(seq);
}

TEST(KvCacheManagerTest, BlocksToRunAlone) {
  // Global: ceil(len/B). Window (W=4, B=4): ceil(W/B) + 1 between steps + 1 during a step.
  EXPECT_EQ(BlocksToRunAlone(Shape(4, 3, 4), 16), (std::array<int, kNumLayerGroups>{4, 3}));
  EXPECT_EQ(BlocksToRunAlone(Shape(4, 3, 4), 5), (std::array<int, kNumLayerGroups>{2, 2}));
  EXPECT_TRUE(FitsPoolAlone(Shape(4, 3, 4), 16));
  EXPECT_FALSE(FitsPoolAlone(Shape(4, 3, 4), 17));  // global-bound
  EXPECT_TRUE(FitsPoolAlone(Shape(100, 4, 8), 400));
  EXPECT_FALSE(FitsPoolAlone(Shape(100, 3, 8), 13));  // window-bound: needs 4
  // Without a window the window group is like the global one.
  EXPECT_EQ(BlocksToRunAlone(Shape(8, 8, 0), 30), (std::array<int, kNumLayerGroups>{8, 8}));
}


// --- Prefix caching ---

std::vector<int32_t> Tokens(int n, int32_t base) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(base + i);
  return t;
}
std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Runs empty `seq` to all of `tokens`: takes its prefix-cache hit, then prefills the rest in
// chunks of `chunk`. Returns the hit.
int RunSequence(KvCacheManager& kv, SequenceKv& seq, const std::vector<int32_t>& tokens,
                int chunk) {
  const PrefixHit hit = kv.FindCachedPrefix(seq, tokens);
  kv.AcquirePrefix(seq, hit);
  while (seq.num_tokens < static_cast<int>(tokens.size())) {
    const int n = std::min<int>(chunk, static_cast<int>(tokens.size()) - seq.num_tokens);
    EXPECT_TRUE(kv.Reserve(seq, seq.num_tokens + n).ok());
    kv.Commit(seq, seq.num_tokens + n, tokens);
  }
  return hit.num_tokens;
}

// The hit rule by brute force over what the pools hold: the largest k <= (len - 1) / B whose
// global blocks [0, k) and window blocks [FirstKept(W, kB) / B, k) are all cached.
int BruteForceHit(const KvCacheManager& kv, SequenceKv seq, const std::vector<int32_t>& tokens) {
  kv.HashBlocks(seq, tokens);
  const int B = kv.block_size();
  for (int k = (static_cast<int>(tokens.size()) - 1) / B; k > 0; --k) {
    bool ok = true;
    for (int i = 0; i < k && ok; ++i) ok = kv.allocator(kG).Lookup(seq.block_hashes[i]).has_value();
    for (int i = kv.FirstKeptPosition(kW, k * B) / B; i < k && ok; ++i) {
      ok = kv.allocator(kW).Lookup(seq.block_hashes[i]).has_value();
    }
    if (ok) return k * B;
  }
  return 0;
}

TEST(PrefixCacheTest, SharedPrefixIsTakenFromTheCache) {
  KvCacheManager kv(Shape(64, 64, /*window=*/6, /*B=*/4), /*prefix_caching=*/true);
  const std::vector<int32_t> t = Tokens(40, 100);
  SequenceKv a;
  EXPECT_EQ(RunSequence(kv, a, t, 7), 0);
  const std::vector<int32_t> a_global = a.blocks[0];
  kv.Free(a);
  EXPECT_EQ(kv.num_used(kG), 0);
  EXPECT_EQ(kv.num_cached(kG), 10);  // every full block, 40 / 4
  EXPECT_EQ(kv.num_cached(kW), 10);  // window blocks were written whole and stay cached
  // b shares 30 tokens: 7 full blocks; its window needs positions [23, 28): blocks 5 and 6.
  const std::vector<int32_t> b_tokens = Concat(std::vector<int32_t>(t.begin(), t.begin() + 30),
                                               Tokens(10, 900));
  SequenceKv b;
  const PrefixHit hit = kv.FindCachedPrefix(b, b_tokens);
  EXPECT_EQ(hit.num_tokens, 28);
  EXPECT_EQ(hit.num_tokens, BruteForceHit(kv, SequenceKv(), b_tokens));
  EXPECT_EQ(hit.blocks[0], std::vector<int32_t>(a_global.begin(), a_global.begin() + 7));
  ASSERT_EQ(hit.blocks[1].size(), 7u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(hit.blocks[1][i], kNoBlock) << i;
  // Admission takes the 7 + 2 cached-but-free hit blocks, plus the kept positions of 40
  // tokens past the hit: global blocks 7-9, window blocks 8-9 (positions >= 35).
  EXPECT_EQ(kv.BlocksToAdmit(b, hit, 40), (std::array<int, kNumLayerGroups>{10, 4}));
  EXPECT_EQ(kv.BlocksToAdmit(b, PrefixHit(), 40), (std::array<int, kNumLayerGroups>{10, 2}));
  kv.AcquirePrefix(b, hit);
  EXPECT_EQ(b.num_tokens, 28);
  EXPECT_EQ(kv.num_used(kG), 7);
  EXPECT_EQ(kv.num_used(kW), 2);
  for (int32_t blk : hit.blocks[0]) EXPECT_EQ(kv.allocator(kG).refcount(blk), 1);
  // A second sequence with the same prefix shares the same blocks.
  SequenceKv c;
  const PrefixHit hit_c = kv.FindCachedPrefix(c, b_tokens);
  EXPECT_EQ(hit_c.blocks[0], hit.blocks[0]);
  kv.AcquirePrefix(c, hit_c);
  for (int32_t blk : hit.blocks[0]) EXPECT_EQ(kv.allocator(kG).refcount(blk), 2);
  kv.Free(c);
  // b goes on from the hit as if it had computed it.
  while (b.num_tokens < 40) {
    ASSERT_TRUE(kv.Reserve(b, b.num_tokens + 1).ok());
    kv.Commit(b, b.num_tokens + 1, b_tokens);
    EXPECT_LE(b.HeldBlocks(kW), kv.WindowBlockBound());
  }
  kv.Free(b);
  EXPECT_EQ(kv.num_used(kG), 0);
  EXPECT_EQ(kv.num_used(kW), 0);
  EXPECT_TRUE(kv.allocator(kG).Validate().ok());
  EXPECT_TRUE(kv.allocator(kW).Validate().ok());
}

TEST(PrefixCacheTest, TheLastBlockIsAlwaysComputed) {
  KvCacheManager kv(Shape(16, 16, 0, 4), true);
  const std::vector<int32_t> t = Tokens(16, 7);  // 4 full blocks
  SequenceKv a;
  RunSequence(kv, a, t, 16);
  kv.Free(a);
  SequenceKv b;
  EXPECT_EQ(kv.FindCachedPrefix(b, t).num_tokens, 12);  // one token is left to compute
  SequenceKv c;
  EXPECT_EQ(kv.FindCachedPrefix(c, Concat(t, {1})).num_tokens, 16);
  SequenceKv d;
  EXPECT_EQ(kv.FindCachedPrefix(d, std::vector<int32_t>(t.begin(), t.begin() + 4)).num_tokens, 0);
}

TEST(PrefixCacheTest, DifferentSaltsNeverShare) {
  KvCacheManager kv(Shape(16, 16, 0, 4), true);
  const std::vector<int32_t> t = Tokens(13, 7);
  SequenceKv a;
  a.hash_root = SaltRoot("tenant-a");
  RunSequence(kv, a, t, 16);
  kv.Free(a);
  SequenceKv other, none, same;
  other.hash_root = SaltRoot("tenant-b");
  same.hash_root = SaltRoot("tenant-a");
  EXPECT_EQ(kv.FindCachedPrefix(other, t).num_tokens, 0);
  EXPECT_EQ(kv.FindCachedPrefix(none, t).num_tokens, 0);
  EXPECT_EQ(kv.FindCachedPrefix(same, t).num_tokens, 12);
}

TEST(PrefixCacheTest, EvictedEarlyWindowBlocksDoNotMatter) {
  // 12 window blocks: a's 10 plus 2 never used.
  KvCacheManager kv(Shape(64, 12, /*window=*/6, /*B=*/4), true);
  const std::vector<int32_t> t = Tokens(40, 100);
  SequenceKv a;
  RunSequence(kv, a, t, 4);
  kv.Free(a);
  // Another prompt takes 4 window blocks: the 2 unused ones, then it evicts the two a
  // released first, its window blocks 0 and 1.
  SequenceKv other;
  RunSequence(kv, other, Tokens(16, 5000), 16);
  EXPECT_EQ(kv.num_evictions(kW), 2);
  EXPECT_EQ(kv.num_evictions(kG), 0);
  kv.Free(other);
  const std::vector<int32_t> b_tokens = Concat(t, Tokens(4, 900));
  SequenceKv b;
  // The query at 40 sees positions >= 35: window blocks 8 and 9 are all it needs.
  EXPECT_EQ(kv.FindCachedPrefix(b, b_tokens).num_tokens, 40);
  EXPECT_EQ(BruteForceHit(kv, SequenceKv(), b_tokens), 40);
}

TEST(PrefixCacheTest, AHoleInTheWindowShortensTheHit) {
  KvCacheManager kv(Shape(64, 14, /*window=*/6, /*B=*/4), true);
  const std::vector<int32_t> t = Tokens(24, 100);
  SequenceKv a;
  RunSequence(kv, a, t, 4);
  kv.Free(a);
  // a2 shares 12 tokens: it takes window blocks 1 and 2 and releases them later than a
  // released its others, so they outlive them in the free queue.
  SequenceKv a2;
  EXPECT_EQ(RunSequence(kv, a2, Concat(std::vector<int32_t>(t.begin(), t.begin() + 12),
                                       Tokens(8, 700)), 4),
            12);
  kv.Free(a2);
  // Evicts the 6 never-used blocks, then a's window blocks 0, 3, 5 and 4.
  SequenceKv other;
  RunSequence(kv, other, Tokens(40, 5000), 40);
  kv.Free(other);
  const std::vector<int32_t> b_tokens = Concat(t, Tokens(8, 900));
  SequenceKv b;
  const PrefixHit hit = kv.FindCachedPrefix(b, b_tokens);
  // Global holds all 6 blocks of t; the window holds blocks 1-2 only: the largest end whose
  // window [end*4 - 5, end*4) is cached is 12.
  EXPECT_EQ(hit.num_tokens, 12);
  EXPECT_EQ(hit.num_tokens, BruteForceHit(kv, SequenceKv(), b_tokens));
  for (int i = 0; i < 6; ++i) {
    EXPECT_TRUE(kv.allocator(kG).Lookup(b.block_hashes[i]).has_value()) << i;
  }
}

TEST(PrefixCacheTest, WithCachingEveryNewPositionGetsAWindowBlock) {
  KvCacheManager off(Shape(16, 16, /*window=*/4, /*B=*/4));
  KvCacheManager on(Shape(16, 16, /*window=*/4, /*B=*/4), true);
  SequenceKv seq;
  EXPECT_EQ(off.BlocksNeeded(seq, kW, 20), 1);  // only the kept positions >= 17
  EXPECT_EQ(on.BlocksNeeded(seq, kW, 20), 5);   // every position, so blocks are whole
  EXPECT_EQ(on.BlocksToHold(seq, kW, 20), 1);   // what it holds once computed
  ASSERT_TRUE(on.Reserve(seq, 20).ok());
  on.Commit(seq, 20, Tokens(20, 0));
  EXPECT_EQ(seq.HeldBlocks(kW), 1);
  EXPECT_EQ(on.num_cached(kW), 5);  // the 4 it released stay cached
  EXPECT_EQ(on.num_used(kW), 1);
  on.Free(seq);
}

TEST(PrefixCacheTest, OnlyCommittedBlocksAreCached) {
  // Blocks reserved past what is committed (e.g. for tokens a caller may take back) are not
  // named by a hash: a later Commit of fewer tokens leaves them uncached.
  KvCacheManager kv(Shape(16, 16, 0, 4), true);
  const std::vector<int32_t> t = Tokens(12, 0);
  SequenceKv seq;
  ASSERT_TRUE(kv.Reserve(seq, 12).ok());
  kv.Commit(seq, 6, t);
  EXPECT_EQ(kv.num_cached(kG), 1);  // block 0 only
  EXPECT_FALSE(kv.allocator(kG).is_cached(seq.blocks[0][1]));
  kv.Commit(seq, 12, t);
  EXPECT_EQ(kv.num_cached(kG), 3);
  kv.Free(seq);
}

TEST(PrefixCacheTest, RejectedDraftBlocksEvictNoCachedPrefix) {
  // Speculative decoding reserves blocks for drafted tokens and gives back those of rejected
  // ones (never named by a hash). They are taken again before any free cached block, so
  // verifying drafts step after step evicts no cached prefix while uncached blocks are free.
  KvCacheManager kv(Shape(16, 16, /*window=*/6, 4), true);
  const std::vector<int32_t> shared = Tokens(40, 100);
  SequenceKv a;
  RunSequence(kv, a, shared, 8);
  kv.Free(a);
  ASSERT_EQ(kv.num_cached(kG), 10);
  const int64_t evictions_before = kv.allocator(kG).num_evictions();
  const std::vector<int32_t> t = Tokens(24, 5000);  // shares nothing with `shared`
  SequenceKv b;
  RunSequence(kv, b, std::vector<int32_t>(t.begin(), t.begin() + 5), 5);
  while (b.num_tokens < 16) {  // at most 6 blocks: with a's 10, the whole pool
    // A verify of 6 drafted tokens (7 positions) of which one is accepted.
    ASSERT_TRUE(kv.Reserve(b, b.num_tokens + 7).ok());
    kv.Commit(b, b.num_tokens + 2, t);
    kv.ReleaseUncommitted(b);
    EXPECT_TRUE(kv.allocator(kG).Validate().ok());
  }
  EXPECT_EQ(kv.allocator(kG).num_evictions(), evictions_before);
  EXPECT_EQ(b.num_tokens, 17);
  EXPECT_EQ(kv.num_cached(kG), 10 + 4);  // a's prefix, and b's own full blocks
  SequenceKv c;
  EXPECT_EQ(kv.FindCachedPrefix(c, Concat(shared, {1})).num_tokens, 40);
  kv.Free(b);
}

// Random sequences sharing prefixes of a few families, run and freed on a small pool: every
// lookup equals the brute-force rule, every hit's blocks hold the hashes they are found by,
// and the pools stay consistent.
TEST(PrefixCacheTest, RandomLookupsMatchTheBruteForceRule) {
  for (int block_size : {1, 3, 4}) {
    KvCacheManager kv(Shape(40, 20, /*window=*/7, block_size), true);
    std::mt19937 rng(17 + block_size);
    std::vector<std::vector<int32_t>> families;
    for (int f = 0; f < 3; ++f) families.push_back(Tokens(40, 1000 * (f + 1)));
    std::vector<SequenceKv> live;
    std::vector<std::vector<int32_t>> live_tokens;
    int hits = 0;
    for (int iter = 0; iter < 400; ++iter) {
      if (!live.empty() && (live.size() > 2 || rng() % 2 == 0)) {
        const size_t i = rng() % live.size();
        kv.Free(live[i]);
        live.erase(live.begin() + i);
        live_tokens.erase(live_tokens.begin() + i);
        continue;
      }
      const auto& fam = families[rng() % families.size()];
      const int shared = 1 + static_cast<int>(rng() % 30);
      std::vector<int32_t> tokens(fam.begin(), fam.begin() + shared);
      const int extra = 1 + static_cast<int>(rng() % 8);
      for (int k = 0; k < extra; ++k) tokens.push_back(static_cast<int32_t>(rng() % 50));
      SequenceKv seq;
      const int expect = BruteForceHit(kv, seq, tokens);
      const PrefixHit hit = kv.FindCachedPrefix(seq, tokens);
      ASSERT_EQ(hit.num_tokens, expect) << "iter " << iter;
      for (int g = 0; g < kNumLayerGroups; ++g) {
        for (size_t b = 0; b < hit.blocks[g].size(); ++b) {
          if (hit.blocks[g][b] == kNoBlock) continue;
          ASSERT_EQ(kv.allocator(static_cast<LayerGroup>(g)).hash(hit.blocks[g][b]),
                    seq.block_hashes[b]);
        }
      }
      hits += hit.num_tokens > 0;
      // Run it if the pools allow (a small pool: otherwise drop it).
      bool fits = true;
      const auto take = kv.BlocksToAdmit(seq, hit, static_cast<int>(tokens.size()));
      for (int g = 0; g < kNumLayerGroups; ++g) {
        fits = fits && take[g] + 1 <= kv.num_free(static_cast<LayerGroup>(g));
      }
      if (!fits) continue;
      kv.AcquirePrefix(seq, hit);
      bool ok = true;
      while (ok && seq.num_tokens < static_cast<int>(tokens.size())) {
        const int n = std::min<int>(1 + rng() % 9, static_cast<int>(tokens.size()) - seq.num_tokens);
        ok = kv.Reserve(seq, seq.num_tokens + n).ok();
        if (ok) kv.Commit(seq, seq.num_tokens + n, tokens);
      }
      if (!ok) {
        kv.Free(seq);
        continue;
      }
      live.push_back(seq);
      live_tokens.push_back(tokens);
      ASSERT_TRUE(kv.allocator(kG).Validate().ok()) << kv.allocator(kG).Validate();
      ASSERT_TRUE(kv.allocator(kW).Validate().ok()) << kv.allocator(kW).Validate();
    }
    for (SequenceKv& seq : live) kv.Free(seq);
    EXPECT_EQ(kv.num_used(kG), 0);
    EXPECT_EQ(kv.num_used(kW), 0);
    EXPECT_GT(hits, 50) << "block size " << block_size;
    EXPECT_GT(kv.num_evictions(kW), 0) << "block size " << block_size;
  }
}

}  // namespace
}  // namespace dcf
