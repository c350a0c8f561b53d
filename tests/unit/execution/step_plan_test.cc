// The host-side step plan every backend shares: the logit-row rule, the limits and cache
// checks, block bytes, the fused projection width, RoPE angles and where results go.
#include "engine/execution/step_plan.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/kv/kv_layout.h"
#include "gtest/gtest.h"

namespace dcf {
namespace {

ModelConfig SmallConfig(int window = 0) {
  ModelConfig c;
  c.dim = 32;
  c.n_layer = 4;
  c.n_head = 4;
  c.head_dim = 8;
  c.intermediate_size = 48;
  c.vocab_size = 64;
  c.max_positions = 64;
  c.rotary_dim = 8;
  if (window > 0) {
    c.window_size = window;
    c.window_pattern = WindowPattern::kLG;
  }
  return c;
}

// Sequences of 3, 1, 2 and 4 tokens: the second and the fourth return their logits; all but
// the third sample.
StepBatch MixedBatch() {
  StepBatch b;
  b.Reset(4);
  const int lens[] = {3, 1, 2, 4};
  const bool sample[] = {true, true, false, true};
  const bool logits[] = {false, true, false, true};
  SequenceKv kv;
  kv.blocks[0] = {0, 1};
  kv.blocks[1] = {0, 1};
  for (int s = 0; s < 4; ++s) {
    std::vector<int32_t> tokens(lens[s], 5);
    b.AddSequence(tokens, kv, sample[s], SamplingRow(), logits[s]);
  }
  return b;
}

TEST(StepPlanTest, ReturnedRowsFirstThenTheLastRowOfEachOtherSampledSequence) {
  const StepBatch b = MixedBatch();  // token offsets 0, 3, 4, 6, 10
  const LogitRows plan = PlanLogitRows(b);
  EXPECT_EQ(plan.rows, (std::vector<int32_t>{3, 6, 7, 8, 9, 2}));
  EXPECT_EQ(plan.num_returned, b.num_logit_rows());
  EXPECT_EQ(plan.num_returned, 5);
  // A sequence that returns its logits samples from its own last returned row.
  EXPECT_EQ(plan.sample_row, (std::vector<int32_t>{5, 0, -1, 4}));
  EXPECT_EQ(plan.sampled_seqs, (std::vector<int32_t>{0, 1, 3}));
  for (int s : plan.sampled_seqs) {
    EXPECT_EQ(plan.rows[plan.sample_row[s]], b.seq_offsets[s + 1] - 1) << s;
  }
}

TEST(StepPlanTest, MaxLogitRowsCoversEveryMixOfReturnedAndSampledRows) {
  StepLimits l;
  l.max_tokens = 100;
  l.max_seqs = 8;
  l.max_logit_rows = 20;
  EXPECT_EQ(MaxLogitRows(l), 28);
  l.max_tokens = 24;
  EXPECT_EQ(MaxLogitRows(l), 24);  // never more rows than tokens
}

TEST(StepPlanTest, StepLimitsMustBePositive) {
  StepLimits l;
  l.max_tokens = 4;
  l.max_seqs = 2;
  l.blocks_per_seq = 1;
  EXPECT_TRUE(ValidateStepLimits(l).ok());
  for (int which = 0; which < 5; ++which) {
    StepLimits bad = l;
    if (which == 0) bad.max_tokens = 0;
    if (which == 1) bad.max_seqs = 0;
    if (which == 2) bad.blocks_per_seq = 0;
    if (which == 3) bad.num_penalty_slots = -1;
    if (which == 4) bad.max_logit_rows = -1;
    EXPECT_EQ(ValidateStepLimits(bad).code(), absl::StatusCode::kInvalidArgument) << which;
  }
}

TEST(StepPlanTest, CacheShapeChecks) {
  const ModelConfig global = SmallConfig();
  const ModelConfig windowed = SmallConfig(16);
  KvCacheShape s;
  s.block_size = 4;
  s.num_blocks = {8, 8};
  s.window = 16;
  EXPECT_TRUE(ValidateCacheShape(s, windowed).ok());
  s.window = 8;
  EXPECT_EQ(ValidateCacheShape(s, windowed).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(ValidateCacheShape(s, global).ok());  // no window layers: the window is unused
  s.block_size = 0;
  EXPECT_EQ(ValidateCacheShape(s, global).code(), absl::StatusCode::kInvalidArgument);
  s.block_size = 4;
  s.num_blocks = {8, -1};
  EXPECT_EQ(ValidateCacheShape(s, global).code(), absl::StatusCode::kInvalidArgument);
}

TEST(StepPlanTest, BytesPerBlockCountTheGroupsLayers) {
  const ModelConfig c = SmallConfig(16);  // kLG: layers 0 and 2 are window layers
  const size_t row = KvRowLayout(c).row_floats();
  EXPECT_EQ(KvBytesPerBlock(c, LayerGroup::kWindow, 16, 4), 4 * 2 * 16 * row);
  EXPECT_EQ(KvBytesPerBlock(c, LayerGroup::kGlobal, 16, 2), 2 * 2 * 16 * row);
  EXPECT_EQ(KvBytesPerBlock(SmallConfig(), LayerGroup::kWindow, 16, 4), 0u);
}

TEST(StepPlanTest, FusedInputWidthIsQkvPlusTheDynamicProjections) {
  const ModelConfig c = SmallConfig();
  // 3E + C*K + C*N with C = 4 branches and K = 4N.
  EXPECT_EQ(FusedInputWidth(c), 3 * 32 + 4 * 16 + 4 * 4);
}

TEST(StepPlanTest, RopeAnglesInDouble) {
  float cs[4], sn[4];
  RopeAngles(0, 8, 10000.0, cs, sn);
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(cs[j], 1.0f);
    EXPECT_EQ(sn[j], 0.0f);
  }
  RopeAngles(1000, 8, 10000.0, cs, sn);
  for (int j = 0; j < 4; ++j) {
    const double angle = 1000.0 * std::pow(10000.0, -2.0 * j / 8);
    EXPECT_EQ(cs[j], static_cast<float>(std::cos(angle)));
    EXPECT_EQ(sn[j], static_cast<float>(std::sin(angle)));
  }
}

TEST(StepPlanTest, StoreSampleWritesWhatTheRowAskedFor) {
  StepOutput out;
  out.Resize(3, 0, 64);
  const int32_t top_tokens[] = {7, 3, 9, 1};
  const float top_logprobs[] = {-0.1f, -1.0f, -2.0f, -3.0f};
  SamplingRow plain;
  StoreSample(plain, 0, 7, -0.1f, top_tokens, top_logprobs, 4, &out);
  SamplingRow two;
  two.top_logprobs = 2;
  StoreSample(two, 2, 3, -1.0f, top_tokens, top_logprobs, 4, &out);
  EXPECT_EQ(out.tokens, (std::vector<int32_t>{7, -1, 3}));
  EXPECT_EQ(out.logprobs[0], 0.0f);  // not asked for
  EXPECT_EQ(out.logprobs[2], -1.0f);
  EXPECT_EQ(out.top_tokens[2 * kMaxTopLogprobs + 0], 7);
  EXPECT_EQ(out.top_tokens[2 * kMaxTopLogprobs + 1], 3);
  EXPECT_EQ(out.top_tokens[2 * kMaxTopLogprobs + 2], -1);  // only the two asked for
  EXPECT_EQ(out.top_logprobs[2 * kMaxTopLogprobs + 1], -1.0f);
}

}  // namespace
}  // namespace dcf

namespace dcf {
namespace {

// A verifying sequence samples its last sample_rows rows, which come consecutively; the
// others keep one row each.
TEST(StepPlanTest, AVerifyingSequenceSamplesItsLastRowsInOrder) {
  StepBatch b;
  b.Reset(4);
  SequenceKv kv;
  kv.blocks[0] = {0, 1};
  kv.blocks[1] = {0, 1};
  b.AddSequence(std::vector<int32_t>{5, 6}, kv, true, SamplingRow(), false);           // 0, 1
  b.AddSequence(std::vector<int32_t>{7, 8, 9, 10}, kv, true, SamplingRow(), false, 3);  // 2..5
  b.AddSequence(std::vector<int32_t>{11, 12, 13}, kv, true, SamplingRow(), true, 2);    // 6..8
  EXPECT_EQ(b.slot_offsets(), (std::vector<int32_t>{0, 1, 4, 6}));
  const LogitRows plan = PlanLogitRows(b);
  EXPECT_EQ(plan.rows, (std::vector<int32_t>{6, 7, 8, 1, 3, 4, 5}));
  EXPECT_EQ(plan.num_returned, 3);
  EXPECT_EQ(plan.sample_row, (std::vector<int32_t>{3, 4, 1}));
  StepLimits l;
  l.max_tokens = 9;
  l.max_seqs = 3;
  l.max_draft_rows = 3;
  EXPECT_EQ(MaxLogitRows(l), 6);

  // Drafts 9, 10 of sequence 1 (its slots 1, 2, 3) and 13 of sequence 2 (slots 4, 5).
  StepOutput out;
  out.Resize(6, 0, 64);
  out.tokens = {1, 9, 4, -1, 13, 2};
  EXPECT_EQ(AcceptedDrafts(b, 1, out, 1), 1);  // 9 accepted, then 4 differs from 10
  EXPECT_EQ(AcceptedDrafts(b, 2, out, 4), 1);  // all drafts: the bonus token follows
  EXPECT_EQ(AcceptedDrafts(b, 0, out, 0), 0);  // a plain sequence
  out.tokens[1] = 3;
  EXPECT_EQ(AcceptedDrafts(b, 1, out, 1), 0);
}

TEST(StepPlanTest, ValidationBoundsSampledRowsDraftsAndSharedSlots) {
  const ModelConfig c = SmallConfig();
  KvCacheShape shape;
  shape.block_size = 4;
  shape.num_blocks = {8, 8};
  StepLimits l;
  l.max_tokens = 16;
  l.max_seqs = 4;
  l.blocks_per_seq = 4;
  l.num_penalty_slots = 4;
  l.max_draft_rows = 2;
  SequenceKv kv;
  kv.blocks[0] = {0, 1};
  kv.blocks[1] = {0, 1};
  SequenceKv kv2;
  kv2.blocks[0] = {2, 3};
  kv2.blocks[1] = {2, 3};
  const auto batch = [&](int rows, int slot0, int slot1) {
    StepBatch b;
    b.Reset(4);
    SamplingRow r0, r1;
    r0.penalty_slot = slot0;
    r1.penalty_slot = slot1;
    b.AddSequence(std::vector<int32_t>{1, 2, 3}, kv, true, r0, false, rows);
    b.AddSequence(std::vector<int32_t>{4}, kv2, true, r1, false);
    return b;
  };
  EXPECT_TRUE(ValidateStepBatch(batch(3, 0, 1), c, shape, l).ok());
  EXPECT_EQ(ValidateStepBatch(batch(4, 0, 1), c, shape, l).code(),
            absl::StatusCode::kInvalidArgument);  // more rows than the sequence has
  EXPECT_EQ(ValidateStepBatch(batch(0, 0, 1), c, shape, l).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateStepBatch(batch(3, 2, 2), c, shape, l).code(),
            absl::StatusCode::kInvalidArgument);  // one penalty slot for two sequences
  l.max_draft_rows = 1;
  EXPECT_EQ(ValidateStepBatch(batch(3, 0, 1), c, shape, l).code(),
            absl::StatusCode::kInvalidArgument);  // more drafts than prepared
  EXPECT_TRUE(ValidateStepBatch(batch(2, -1, -1), c, shape, l).ok());
}

// Chained tokens (step_batch.h): only the one token of a sequence that samples one row, each
// slot once, within the slots a step has; ChainableSlots marks the slots a next step may
// chain with their sampled row, and CheckChainedTokens holds a batch to them.
TEST(StepPlanTest, ChainedTokensNameOneSampledSlotOfThePreviousStep) {
  EXPECT_EQ(ChainedToken(0), -2);
  EXPECT_EQ(ChainedSlot(ChainedToken(7)), 7);
  EXPECT_EQ(ChainedSlot(-1), -1);
  EXPECT_EQ(ChainedSlot(0), -1);
  const ModelConfig c = SmallConfig();
  KvCacheShape shape;
  shape.block_size = 4;
  shape.num_blocks = {8, 8};
  StepLimits l;
  l.max_tokens = 16;
  l.max_seqs = 3;
  l.blocks_per_seq = 4;
  l.max_draft_rows = 2;  // so a step has 5 slots at most
  SequenceKv kv;
  kv.blocks[0] = {0, 1};
  kv.blocks[1] = {0, 1};
  const auto batch = [&](std::vector<int32_t> first, bool sample, int rows,
                         std::vector<int32_t> second) {
    StepBatch b;
    b.Reset(4);
    b.AddSequence(first, kv, sample, SamplingRow(), false, rows);
    b.AddSequence(second, kv, true, SamplingRow(), false);
    return b;
  };
  const auto code = [&](const StepBatch& b) { return ValidateStepBatch(b, c, shape, l).code(); };
  EXPECT_EQ(code(batch({ChainedToken(4)}, true, 1, {ChainedToken(0)})), absl::StatusCode::kOk);
  EXPECT_EQ(code(batch({ChainedToken(5)}, true, 1, {3})), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(batch({ChainedToken(1)}, true, 1, {ChainedToken(1)})),
            absl::StatusCode::kInvalidArgument);  // one slot chained twice
  EXPECT_EQ(code(batch({ChainedToken(1)}, false, 1, {3})),
            absl::StatusCode::kInvalidArgument);  // a sequence that does not sample
  EXPECT_EQ(code(batch({3, ChainedToken(1)}, true, 1, {3})),
            absl::StatusCode::kInvalidArgument);  // a chunk of two tokens
  EXPECT_EQ(code(batch({3, ChainedToken(1)}, true, 2, {3})),
            absl::StatusCode::kInvalidArgument);  // a verified draft
  EXPECT_EQ(code(batch({-1}, true, 1, {3})), absl::StatusCode::kInvalidArgument);

  // The previous step: slots 0 (a prefill chunk that does not sample), 1..3 (a sequence
  // verifying 2 drafts), 4 (a plain decode): only slot 4 may be chained, as sampled row 3.
  StepBatch previous;
  previous.Reset(4);
  previous.AddSequence(std::vector<int32_t>{1, 2}, kv, false, SamplingRow(), false);
  previous.AddSequence(std::vector<int32_t>{1, 2, 3}, kv, true, SamplingRow(), false, 3);
  previous.AddSequence(std::vector<int32_t>{4}, kv, true, SamplingRow(), false);
  const std::vector<int32_t> chainable = ChainableSlots(previous);
  EXPECT_EQ(chainable, (std::vector<int32_t>{-1, -1, -1, -1, 3}));
  EXPECT_TRUE(CheckChainedTokens(batch({ChainedToken(4)}, true, 1, {7}), chainable).ok());
  for (int slot : {0, 1, 3, 5}) {
    const absl::Status st =
        CheckChainedTokens(batch({5}, true, 1, {ChainedToken(slot)}), chainable);
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << slot;
    EXPECT_EQ(st.message(), absl::StrCat("sequence 1 chains slot ", slot,
                                         ", which the previous step did not sample as one "
                                         "sequence's row"));
  }
  EXPECT_EQ(CheckChainedTokens(batch({ChainedToken(0)}, true, 1, {7}), {}).message(),
            "sequence 0 chains slot 0, but no step was launched before it");
}

}  // namespace
}  // namespace dcf
