#include "engine/kv/block_allocator.h"

#include <vector>

#include "gtest/gtest.h"

namespace dcf {
namespace {

TEST(BlockAllocatorTest, AllocatesLowestFirstUntilEmpty) {
  BlockAllocator a(3);
  EXPECT_EQ(a.num_free(), 3);
  EXPECT_EQ(*a.Allocate(), 0);
  EXPECT_EQ(*a.Allocate(), 1);
  EXPECT_EQ(*a.Allocate(), 2);
  EXPECT_FALSE(a.Allocate().has_value());
  EXPECT_EQ(a.num_used(), 3);
  a.Release(1);
  EXPECT_EQ(a.num_free(), 1);
  EXPECT_EQ(*a.Allocate(), 1);
}

TEST(BlockAllocatorTest, ReferenceCountKeepsSharedBlocks) {
  BlockAllocator a(2);
  const int32_t b = *a.Allocate();
  a.AddRef(b);
  EXPECT_EQ(a.refcount(b), 2);
  a.Release(b);
  EXPECT_EQ(a.refcount(b), 1);
  EXPECT_EQ(a.num_free(), 1);
  a.Release(b);
  EXPECT_EQ(a.refcount(b), 0);
  EXPECT_EQ(a.num_free(), 2);
}

BlockHash H(uint64_t x) { return BlockHash{x, ~x}; }

TEST(BlockAllocatorTest, FreeBlocksAreReusedLeastRecentlyReleasedFirst) {
  BlockAllocator a(4);
  std::vector<int32_t> b;
  for (int i = 0; i < 4; ++i) b.push_back(*a.Allocate());
  a.Release(b[2]);
  a.Release(b[0]);
  a.Release(b[3]);
  EXPECT_EQ(*a.Allocate(), b[2]);
  EXPECT_EQ(*a.Allocate(), b[0]);
  EXPECT_EQ(*a.Allocate(), b[3]);
  EXPECT_TRUE(a.Validate().ok()) << a.Validate();
}

TEST(BlockAllocatorTest, CachedFreeBlocksAreHitOrEvicted) {
  BlockAllocator a(3);
  const int32_t x = *a.Allocate(), y = *a.Allocate();
  EXPECT_TRUE(a.Cache(x, H(1)));
  EXPECT_TRUE(a.Cache(y, H(2)));
  EXPECT_FALSE(a.Cache(*a.Allocate(), H(1)));  // one block per hash: the first stays
  EXPECT_EQ(a.num_cached(), 2);
  a.Release(x);
  a.Release(y);
  EXPECT_EQ(a.num_free(), 2);  // cached blocks count as free
  EXPECT_EQ(a.num_used(), 1);
  EXPECT_EQ(a.Lookup(H(1)), x);
  EXPECT_TRUE(a.Validate().ok()) << a.Validate();
  // A hit takes the free cached block back out of the queue.
  a.AddRef(y);
  EXPECT_EQ(a.refcount(y), 1);
  EXPECT_EQ(a.num_free(), 1);
  EXPECT_TRUE(a.Validate().ok()) << a.Validate();
  // Allocate evicts x (released longest ago): its hash goes, the in-use y keeps its own.
  EXPECT_EQ(*a.Allocate(), x);
  EXPECT_EQ(a.num_evictions(), 1);
  EXPECT_FALSE(a.Lookup(H(1)).has_value());
  EXPECT_FALSE(a.is_cached(x));
  EXPECT_EQ(a.Lookup(H(2)), y);
  EXPECT_FALSE(a.Allocate().has_value());  // y is in use: never evicted
  EXPECT_TRUE(a.Validate().ok()) << a.Validate();
}

TEST(BlockAllocatorTest, UncachedFreeBlocksAreTakenBeforeAnyEviction) {
  BlockAllocator a(4);
  std::vector<int32_t> b;
  for (int i = 0; i < 4; ++i) b.push_back(*a.Allocate());
  EXPECT_TRUE(a.Cache(b[0], H(1)));
  EXPECT_TRUE(a.Cache(b[2], H(2)));
  // Released in the order b0 (cached), b1, b2 (cached), b3: the uncached ones go first, each
  // queue least recently released first, and only then are cached blocks evicted.
  for (int32_t x : b) a.Release(x);
  EXPECT_TRUE(a.Validate().ok()) << a.Validate();
  EXPECT_EQ(*a.Allocate(), b[1]);
  EXPECT_EQ(*a.Allocate(), b[3]);
  EXPECT_EQ(a.num_evictions(), 0);
  EXPECT_EQ(a.Lookup(H(1)), b[0]);
  EXPECT_EQ(a.Lookup(H(2)), b[2]);
  // An uncached block released now still goes before the cached ones released earlier.
  a.Release(b[3]);
  EXPECT_EQ(*a.Allocate(), b[3]);
  EXPECT_EQ(a.num_evictions(), 0);
  EXPECT_EQ(*a.Allocate(), b[0]);
  EXPECT_EQ(a.num_evictions(), 1);
  EXPECT_FALSE(a.Lookup(H(1)).has_value());
  EXPECT_EQ(a.Lookup(H(2)), b[2]);
  EXPECT_TRUE(a.Validate().ok()) << a.Validate();
}

TEST(BlockAllocatorDeathTest, AddRefOnAFreeUncachedBlockAborts) {
  BlockAllocator a(1);
  const int32_t b = *a.Allocate();
  a.Release(b);
  EXPECT_DEATH(a.AddRef(b), "not cached");
}

TEST(BlockAllocatorDeathTest, DoubleFreeAborts) {
  BlockAllocator a(1);
  const int32_t b = *a.Allocate();
  a.Release(b);
  EXPECT_DEATH(a.Release(b), "double free");
}

}  // namespace
}  // namespace dcf
