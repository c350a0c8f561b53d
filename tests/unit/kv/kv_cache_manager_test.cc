#include "engine/kv/kv_cache_manager.h"

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

}  // namespace
}  // namespace dcf
