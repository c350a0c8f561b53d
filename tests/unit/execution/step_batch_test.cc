// ValidateStepBatch checks cache blocks once per block (O(blocks) per sequence, not one
// check per context position): against the per-position check it replaced, kept here as the
// reference, on random valid and malformed batches (missing, out-of-range and negative block
// ids, short tables, broken positions and token ids, bad sampling rows, window and global
// layers, block sizes 1..16): the same refusals with the same messages, and the same batches
// accepted.
#include <random>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/execution/step_batch.h"
#include "engine/kv/kv_cache_manager.h"
#include "gtest/gtest.h"

namespace dcf {
namespace {

// The check before it went per block: every position of every sequence, one by one.
absl::Status ReferenceValidateStepBatch(const StepBatch& b, const ModelConfig& config,
                               const KvCacheShape& cache, const StepLimits& limits) {
  const int S = b.num_seqs(), T = b.num_tokens(), B = cache.block_size;
  if (B <= 0) return absl::FailedPreconditionError("the KV cache is not allocated");
  if (S == 0) return absl::InvalidArgumentError("the step batch is empty");
  if (static_cast<int>(b.seq_offsets.size()) != S + 1 || b.seq_offsets[0] != 0 ||
      b.seq_offsets[S] != T || static_cast<int>(b.positions.size()) != T ||
      static_cast<int>(b.sampling.size()) != S || static_cast<int>(b.return_logits.size()) != S ||
      static_cast<int>(b.sample_rows.size()) != S) {
    return absl::InvalidArgumentError("step batch arrays disagree in size");
  }
  if (T > limits.max_tokens || S > limits.max_seqs) {
    return absl::InvalidArgumentError(absl::StrCat("step of ", T, " tokens in ", S,
                                                   " sequences exceeds the prepared limits (",
                                                   limits.max_tokens, " tokens, ",
                                                   limits.max_seqs, " sequences)"));
  }
  if (b.num_logit_rows() > limits.max_logit_rows) {
    return absl::InvalidArgumentError(absl::StrCat("step asks for ", b.num_logit_rows(),
                                                   " logit rows, more than the prepared ",
                                                   limits.max_logit_rows));
  }
  if (b.blocks_per_seq != limits.blocks_per_seq) {
    return absl::InvalidArgumentError(absl::StrCat("block tables of ", b.blocks_per_seq,
                                                   " entries, the backend was prepared for ",
                                                   limits.blocks_per_seq));
  }
  int draft_rows = 0;
  // A slot's penalty state is updated as its sequence samples (in parallel on the CPU): two
  // sequences of a step must never share one.
  std::vector<uint8_t> slot_used(std::max(limits.num_penalty_slots, 0), 0);
  for (int s = 0; s < S; ++s) {
    if (!b.sample[s]) continue;
    draft_rows += b.sample_rows[s] - 1;
    const int32_t slot = b.sampling[s].penalty_slot;
    if (slot >= 0 && slot < limits.num_penalty_slots) {
      if (slot_used[slot]) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", s, ": penalty slot ", slot, " is used twice in the step"));
      }
      slot_used[slot] = 1;
    }
  }
  if (draft_rows > limits.max_draft_rows) {
    return absl::InvalidArgumentError(absl::StrCat("step verifies ", draft_rows,
                                                   " drafted tokens, more than the prepared ",
                                                   limits.max_draft_rows));
  }
  for (int g = 0; g < kNumLayerGroups; ++g) {
    if (b.block_tables[g].size() != static_cast<size_t>(S) * b.blocks_per_seq) {
      return absl::InvalidArgumentError("block table size disagrees with the batch");
    }
  }
  for (int s = 0; s < S; ++s) {
    const int n = b.seq_len(s);
    if (n <= 0) return absl::InvalidArgumentError(absl::StrCat("sequence ", s, " is empty"));
    const int start = b.start_pos(s), end = start + n;
    if (start < 0 || end > config.max_positions) {
      return absl::OutOfRangeError(absl::StrCat("sequence ", s, ": positions [", start, ", ",
                                                end, ") exceed the model context of ",
                                                config.max_positions));
    }
    for (int i = 0; i < n; ++i) {
      const int t = b.seq_offsets[s] + i;
      if (b.positions[t] != start + i) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", s, ": positions are not consecutive"));
      }
      if (b.tokens[t] < 0 || b.tokens[t] >= config.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": token id ",
                                                       b.tokens[t],
                                                       " is outside the vocabulary [0, ",
                                                       config.vocab_size, ")"));
      }
    }
    // Every block read (cached keys) or kept (new rows that stay) must be present; a new row
    // that is not kept is written where its table names a block, which must be the pool's.
    for (int g = 0; g < kNumLayerGroups; ++g) {
      const LayerGroup group = static_cast<LayerGroup>(g);
      if (config.NumLayersIn(group) == 0) continue;
      const int window = group == LayerGroup::kWindow ? config.window_size : 0;
      const int read_from = FirstKeptPosition(window, start);
      const int write_from = std::max(start, FirstKeptPosition(window, end));
      const int32_t* table = &b.block_tables[g][static_cast<size_t>(s) * b.blocks_per_seq];
      for (int p = std::min(read_from, write_from); p < end; ++p) {
        const int blk = p / B;
        const bool optional = p >= start && p < write_from;  // a new row that is not kept
        const bool present = blk < b.blocks_per_seq && table[blk] != kNoBlock;
        if (optional && !present) continue;
        if (!present || table[blk] < 0 || table[blk] >= cache.num_blocks[g]) {
          return absl::FailedPreconditionError(
              absl::StrCat("sequence ", s, ": no KV block for position ", p, " in the ",
                           g == 0 ? "global" : "window", " group"));
        }
      }
    }
    if (b.sample[s] && (b.sample_rows[s] < 1 || b.sample_rows[s] > n)) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": samples ",
                                                     b.sample_rows[s], " rows of its ", n));
    }
    if (b.sample[s]) {
      const SamplingRow& r = b.sampling[s];
      if (absl::Status st = ValidateSamplingParams(r.params); !st.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": ", st.message()));
      }
      if (r.penalty_slot >= limits.num_penalty_slots ||
          (r.penalty_slot < 0 && r.params.HasPenalties())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sequence ", s, ": penalty slot ", r.penalty_slot, " is not one of the ",
            limits.num_penalty_slots, " slots (penalties need one)"));
      }
      if (r.top_logprobs < 0 || r.top_logprobs > kMaxTopLogprobs) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", s, ": top_logprobs ", r.top_logprobs, " is outside [0, ",
                         kMaxTopLogprobs, "]"));
      }
    }
  }
  return absl::OkStatus();
}

ModelConfig Config(int window) {
  ModelConfig c;
  c.dim = 32;
  c.n_layer = 4;
  c.n_head = 4;
  c.head_dim = 8;
  c.intermediate_size = 48;
  c.vocab_size = 64;
  c.max_positions = 96;
  c.rotary_dim = 8;
  if (window > 0) {
    c.window_size = window;
    c.window_pattern = WindowPattern::kLG;
  }
  return c;
}

struct Case {
  ModelConfig config;
  KvCacheShape cache;
  StepLimits limits;
  StepBatch batch;
};

// A random batch; `missing` is the chance that a logical block is absent, `bad` that its id
// is outside the pool, and with small chances one other field is broken.
Case RandomCase(std::mt19937& rng, double missing, double bad) {
  auto coin = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Case c;
  const int windows[] = {0, 4, 8, 13};
  c.config = Config(windows[uni(0, 3)]);
  const int sizes[] = {1, 3, 4, 5, 16};
  const int B = sizes[uni(0, 4)];
  c.cache.block_size = B;
  c.cache.window = c.config.window_size;
  c.cache.num_blocks = {uni(1, 60), uni(1, 60)};
  const int context_blocks = (c.config.max_positions + B - 1) / B;
  const int blocks_per_seq = coin(0.05) ? uni(1, context_blocks) : context_blocks;
  c.limits.max_tokens = 128;
  c.limits.max_seqs = 8;
  c.limits.max_logit_rows = 128;
  c.limits.blocks_per_seq = blocks_per_seq;
  c.limits.num_penalty_slots = 4;
  StepBatch& b = c.batch;
  b.Reset(blocks_per_seq);
  const int S = uni(1, 5);
  for (int s = 0; s < S; ++s) {
    const int n = uni(1, 12);
    const int start = uni(0, c.config.max_positions - (coin(0.03) ? 0 : n));
    SequenceKv kv;
    kv.num_tokens = start;
    for (int g = 0; g < kNumLayerGroups; ++g) {
      const int len = uni(0, blocks_per_seq);
      for (int i = 0; i < len; ++i) {
        int32_t id = uni(0, c.cache.num_blocks[g] - 1);
        if (coin(missing)) id = kNoBlock;
        if (coin(bad)) id = coin(0.5) ? c.cache.num_blocks[g] + uni(0, 3) : -uni(2, 5);
        kv.blocks[g].push_back(id);
      }
      // Most tables cover the sequence's new positions; some stop short.
      if (!coin(0.1)) {
        const int need = std::min(blocks_per_seq, (start + n + B - 1) / B);
        while (static_cast<int>(kv.blocks[g].size()) < need) {
          kv.blocks[g].push_back(coin(missing) ? kNoBlock : uni(0, c.cache.num_blocks[g] - 1));
        }
      }
    }
    std::vector<int32_t> tokens(n);
    for (int32_t& t : tokens) t = uni(0, c.config.vocab_size - 1);
    if (coin(0.02)) tokens[uni(0, n - 1)] = coin(0.5) ? -1 : c.config.vocab_size;
    SamplingRow row;
    row.params.temperature = coin(0.5) ? 0.0f : 0.8f;
    row.penalty_slot = coin(0.3) ? uni(-1, 4) : -1;
    row.top_logprobs = coin(0.02) ? 21 : uni(0, 3);
    b.AddSequence(tokens, kv, coin(0.8), row, coin(0.1), 1);
  }
  if (coin(0.02)) {
    const int t = uni(0, b.num_tokens() - 1);
    b.positions[t] += 1;
  }
  return c;
}

TEST(StepBatchTest, PerBlockCheckEqualsThePerPositionCheck) {
  std::mt19937 rng(20261202);
  int accepted = 0, block_refusals = 0, other_refusals = 0;
  const double missing[] = {0.0, 0.02, 0.1, 0.4};
  const double bad[] = {0.0, 0.0, 0.01, 0.05};
  for (int trial = 0; trial < 20000; ++trial) {
    const Case c = RandomCase(rng, missing[trial % 4], bad[(trial / 4) % 4]);
    const absl::Status want = ReferenceValidateStepBatch(c.batch, c.config, c.cache, c.limits);
    const absl::Status got = ValidateStepBatch(c.batch, c.config, c.cache, c.limits);
    ASSERT_EQ(got.code(), want.code()) << trial << ": " << got << " vs " << want;
    ASSERT_EQ(got.message(), want.message()) << trial;
    if (want.ok()) {
      ++accepted;
    } else if (absl::StrContains(want.message(), "no KV block")) {
      ++block_refusals;
    } else {
      ++other_refusals;
    }
  }
  // The generator reaches every outcome often.
  EXPECT_GT(accepted, 2000);
  EXPECT_GT(block_refusals, 2000);
  EXPECT_GT(other_refusals, 500);
}

// Hand-made: a decode token at position 40 with block size 4 on a window-8 layer reads
// positions 33..39 and keeps 40; blocks 0..7 of the window table may be absent, block 8
// (positions 32..35) may not.
TEST(StepBatchTest, WindowTableNeedsOnlyTheBlocksItReads) {
  const ModelConfig config = Config(8);
  KvCacheShape cache;
  cache.block_size = 4;
  cache.window = 8;
  cache.num_blocks = {30, 30};
  StepLimits limits;
  limits.max_tokens = 8;
  limits.max_seqs = 2;
  limits.max_logit_rows = 8;
  limits.blocks_per_seq = 24;
  auto batch = [&](int absent_window_block) {
    StepBatch b;
    b.Reset(24);
    SequenceKv kv;
    kv.num_tokens = 40;
    for (int i = 0; i <= 10; ++i) {
      kv.blocks[0].push_back(i);
      kv.blocks[1].push_back(i < 8 || i == absent_window_block ? kNoBlock : i);
    }
    SamplingRow row;
    row.params.temperature = 0;
    b.AddSequence({7}, kv, true, row, false);
    return b;
  };
  EXPECT_TRUE(ValidateStepBatch(batch(-1), config, cache, limits).ok());
  const absl::Status st = ValidateStepBatch(batch(8), config, cache, limits);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.message(), "sequence 0: no KV block for position 33 in the window group");
  EXPECT_EQ(ValidateStepBatch(batch(10), config, cache, limits).message(),
            "sequence 0: no KV block for position 40 in the window group");
}

}  // namespace
}  // namespace dcf
