#include "engine/kv/kv_cache_planner.h"

#include <algorithm>
#include <array>
#include <string>

#include "absl/strings/numbers.h"
#include "gmock/gmock.h"
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

// A 16-bit KV cache (--kv-cache-dtype) halves the backend's bytes per block: the same budget
// then plans twice the blocks, so twice the tokens.
TEST(KvCachePlannerTest, HalfTheBytesPerBlockPlansTwiceTheBlocks) {
  KvPlanInput in = Input(40000);
  in.max_num_seqs = 10;  // up to 160 blocks of use: the budget, not the cap, decides
  in.window = 0;
  in.bytes_per_block = {1000, 0};
  auto f32 = PlanKvCache(in);
  in.bytes_per_block = {500, 0};
  auto f16 = PlanKvCache(in);
  ASSERT_TRUE(f32.ok()) << f32.status();
  ASSERT_TRUE(f16.ok()) << f16.status();
  EXPECT_EQ(f32->num_blocks[0], 40);
  EXPECT_EQ(f16->num_blocks[0], 80);
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

// The budget is an upper bound (docs/API.md, --kv-cache-bytes): whole blocks within it, never
// more than max_num_seqs sequences can use; KvPlanIsCappedBySequences says which limited it.
TEST(KvCachePlannerTest, BudgetBeyondWhatSequencesCanUseIsLeftAndReported) {
  KvPlanInput in = Input(100000);
  auto shape = PlanKvCache(in);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->num_blocks[0], 64);  // 4 sequences of 16 blocks: 80000 of 100000 bytes
  EXPECT_TRUE(KvPlanIsCappedBySequences(in, *shape));
  in.max_num_seqs = 8;  // demand 8 * 2 + 4 + 8 = 28 window blocks, 128 global: over budget
  shape = PlanKvCache(in);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->num_blocks[1], 28);
  EXPECT_EQ(shape->num_blocks[0], 72);  // the rest: 72000 bytes
  EXPECT_FALSE(KvPlanIsCappedBySequences(in, *shape));
  const auto budget_limited = PlanKvCache(Input(40000));
  ASSERT_TRUE(budget_limited.ok());
  EXPECT_FALSE(KvPlanIsCappedBySequences(Input(40000), *budget_limited));
}

TEST(KvCachePlannerTest, WhatTheCappedGlobalGroupLeavesGoesToTheWindowGroup) {
  // Window blocks of 6000 bytes: the demand of 16 (96000) is more than half of 150000, so the
  // window group first gets 12 blocks (72000); the global group takes its cap of 64 (64000 of
  // the 78000 left); the 14000 left buy 2 more window blocks.
  KvPlanInput in = Input(150000);
  in.bytes_per_block = {1000, 6000};
  auto shape = PlanKvCache(in);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->num_blocks[0], 64);
  EXPECT_EQ(shape->num_blocks[1], 14);
  EXPECT_FALSE(KvPlanIsCappedBySequences(in, *shape));
  in.budget_bytes = 1000000;  // enough for both caps
  shape = PlanKvCache(in);
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->num_blocks[0], 64);
  EXPECT_EQ(shape->num_blocks[1], 16);
  EXPECT_TRUE(KvPlanIsCappedBySequences(in, *shape));
}

// The bytes a refusal says are needed ("needs at least N bytes"), or 0.
size_t StatedNeed(const KvPlanInput& in) {
  const auto shape = PlanKvCache(in);
  EXPECT_EQ(shape.status().code(), absl::StatusCode::kResourceExhausted) << shape.status();
  const std::string msg(shape.status().message());
  const size_t at = msg.find("needs at least ");
  size_t need = 0;
  if (at == std::string::npos) return 0;
  const size_t from = at + 15;
  EXPECT_TRUE(absl::SimpleAtoi(msg.substr(from, msg.find(' ', from) - from), &need)) << msg;
  return need;
}

// The refusal states the true minimum: that budget is served, one byte less is not, and so is
// every budget above it (the half-and-half split alone would refuse budgets up to 41% above it:
// the window group's half of the budget in whole blocks leaves the global group short).
TEST(KvCachePlannerTest, TheStatedMinimumBudgetIsAccepted) {
  struct Case {
    int block_size;
    std::array<size_t, kNumLayerGroups> bytes_per_block;
    int max_num_seqs;
  };
  // dcformer-kjv (2 global + 2 window layers, 3552 bytes per token each, window 64, context
  // 256) at block sizes 16 and 1, and uneven groups.
  for (const Case& c : {Case{16, {56832, 56832}, 64}, Case{1, {3552, 3552}, 64},
                        Case{16, {1000, 3000}, 4}, Case{16, {3000, 1000}, 4}, Case{4, {777, 0}, 2},
                        Case{4, {0, 777}, 2}, Case{7, {1234, 5678}, 9}}) {
    KvPlanInput in = Input(1);
    in.block_size = c.block_size;
    in.window = 64;
    in.max_num_seqs = c.max_num_seqs;
    in.max_num_batched_tokens = 2048;
    in.bytes_per_block = c.bytes_per_block;
    const size_t need = StatedNeed(in);
    ASSERT_GT(need, 0u);
    in.budget_bytes = need - 1;
    EXPECT_EQ(PlanKvCache(in).status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(std::string(PlanKvCache(in).status().message()),
                ::testing::HasSubstr("needs at least " + std::to_string(need) + " bytes"));
    KvCacheShape alone_shape;
    alone_shape.block_size = c.block_size;
    alone_shape.window = in.window;
    const auto alone = BlocksToRunAlone(alone_shape, in.context);
    const size_t step = std::max<size_t>(1, need / 5000);
    for (size_t budget = need; budget <= 3 * need; budget += step) {
      in.budget_bytes = budget;
      const auto shape = PlanKvCache(in);
      ASSERT_TRUE(shape.ok()) << "block " << c.block_size << ", budget " << budget << ": "
                              << shape.status();
      size_t bytes = 0;
      for (int g = 0; g < kNumLayerGroups; ++g) {
        bytes += c.bytes_per_block[g] * static_cast<size_t>(shape->num_blocks[g]);
        EXPECT_GE(shape->num_blocks[g], alone[g]) << "budget " << budget << ", group " << g;
      }
      EXPECT_LE(bytes, budget);
      EXPECT_TRUE(FitsPoolAlone(*shape, in.context));
    }
  }
}

}  // namespace
}  // namespace dcf
