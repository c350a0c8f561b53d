#include "engine/kv/block_allocator.h"

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

TEST(BlockAllocatorDeathTest, DoubleFreeAborts) {
  BlockAllocator a(1);
  const int32_t b = *a.Allocate();
  a.Release(b);
  EXPECT_DEATH(a.Release(b), "double free");
}

}  // namespace
}  // namespace dcf
