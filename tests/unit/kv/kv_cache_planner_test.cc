#include "engine/kv/kv_cache_planner.h"

#include "gtest/gtest.h"

namespace dcf {
namespace {

KvPlanInput Input(size_t budget) {
  KvPlanInput in;
  in.budget_bytes = budget;
  in.block_size = 16;
  in.window = 16;
  in.context = 256;
  in.max_num_seqs = 4;
  in.max_num_batched_tokens = 64;
  in.bytes_per_block = {1000, 1000};
  return in;
}

TEST(KvCachePlannerTest, WindowGroupGetsItsDemandAndGlobalTheRest) {
  const KvPlanInput in = Input(100000);
  // 4 * (1 + 1) + 64/16 + min(4, 64) = 16
  EXPECT_EQ(WindowGroupDemand(in), 16);
  auto shape = PlanKvCache(in);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->num_blocks[1], 16);
  EXPECT_EQ(shape->num_blocks[0], 64);  // capped: 4 seqs * 16 blocks of context
  EXPECT_EQ(shape->window, 16);
}

TEST(KvCachePlannerTest, SmallBudgetSplitsInHalf) {
  auto shape = PlanKvCache(Input(40000));
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->num_blocks[1], 16);  // 16000 <= 20000: full demand
  EXPECT_EQ(shape->num_blocks[0], 24);
  KvPlanInput in = Input(40000);
  in.bytes_per_block = {1000, 3000};  // window demand 48000 > half
  shape = PlanKvCache(in);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->num_blocks[1], 6);
  EXPECT_EQ(shape->num_blocks[0], 22);
}

TEST(KvCachePlannerTest, TooSmallBudgetIsResourceExhausted) {
  auto shape = PlanKvCache(Input(10000));
  EXPECT_EQ(shape.status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(KvCachePlannerTest, GroupWithoutLayersCostsNothing) {
  KvPlanInput in = Input(20000);
  in.bytes_per_block = {1000, 0};
  auto shape = PlanKvCache(in);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->num_blocks[0], 20);
  EXPECT_EQ(shape->num_blocks[1], 16);
}

}  // namespace
}  // namespace dcf
