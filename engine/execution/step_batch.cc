#include "engine/execution/step_batch.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/common/logging.h"

namespace dcf {

int StepBatch::num_logit_rows() const {
  int rows = 0;
  for (int s = 0; s < num_seqs(); ++s) {
    if (return_logits[s]) rows += seq_len(s);
  }
  return rows;
}

std::vector<int32_t> StepBatch::slot_offsets() const {
  std::vector<int32_t> offsets(num_seqs() + 1, 0);
  for (int s = 0; s < num_seqs(); ++s) offsets[s + 1] = offsets[s] + num_slots(s);
  return offsets;
}

void StepBatch::Reset(int capacity) {
  tokens.clear();
  positions.clear();
  seq_offsets.assign(1, 0);
  blocks_per_seq = capacity;
  for (auto& t : block_tables) t.clear();
  sample.clear();
  sampling.clear();
  sample_rows.clear();
  return_logits.clear();
}

void StepBatch::AddSequence(absl::Span<const int32_t> new_tokens, const SequenceKv& kv,
                            bool sample_token, const SamplingRow& row, bool logits,
                            int rows) {
  for (size_t i = 0; i < new_tokens.size(); ++i) {
    tokens.push_back(new_tokens[i]);
    positions.push_back(kv.num_tokens + static_cast<int32_t>(i));
  }
  seq_offsets.push_back(static_cast<int32_t>(tokens.size()));
  for (int g = 0; g < kNumLayerGroups; ++g) {
    const std::vector<int32_t>& table = kv.blocks[g];
    DCF_CHECK(static_cast<int>(table.size()) <= blocks_per_seq)
        << "block table of " << table.size() << " blocks exceeds the capacity " << blocks_per_seq;
    block_tables[g].insert(block_tables[g].end(), table.begin(), table.end());
    block_tables[g].resize(block_tables[g].size() + blocks_per_seq - table.size(), kNoBlock);
  }
  sample.push_back(sample_token ? 1 : 0);
  sampling.push_back(row);
  sample_rows.push_back(rows);
  return_logits.push_back(logits ? 1 : 0);
}

void StepOutput::Resize(int num_slots, int num_logit_rows, int vocab_size) {
  tokens.assign(num_slots, -1);
  nonfinite.assign(num_slots, 0);
  logprobs.assign(num_slots, 0.0f);
  top_tokens.assign(static_cast<size_t>(num_slots) * kMaxTopLogprobs, -1);
  top_logprobs.assign(static_cast<size_t>(num_slots) * kMaxTopLogprobs, 0.0f);
  logits.resize(static_cast<size_t>(num_logit_rows) * vocab_size);
}

absl::Status ValidateStepBatch(const StepBatch& b, const ModelConfig& config,
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
  std::vector<uint8_t> chained;  // [slots of a step] 1: chained already (made at the first)
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
      if (b.tokens[t] >= 0 && b.tokens[t] < config.vocab_size) continue;
      const int slot = ChainedSlot(b.tokens[t]);
      if (slot < 0) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": token id ",
                                                       b.tokens[t],
                                                       " is outside the vocabulary [0, ",
                                                       config.vocab_size, ")"));
      }
      if (n != 1 || !b.sample[s] || b.sample_rows[s] != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", s, ": chains the token of slot ", slot,
                         " but is not a single token that samples one row"));
      }
      // A step has at most one slot per sequence plus one per verified draft.
      const int max_slots = limits.max_seqs + limits.max_draft_rows;
      if (slot >= max_slots) {
        return absl::InvalidArgumentError(absl::StrCat("sequence ", s, ": chains slot ", slot,
                                                       ", beyond the ", max_slots,
                                                       " slots a step has"));
      }
      if (chained.empty()) chained.assign(max_slots, 0);
      if (chained[slot]) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", s, ": slot ", slot, " is chained twice in the step"));
      }
      chained[slot] = 1;
    }
    // Every block read (cached keys) or kept (new rows that stay) must be present; a new row
    // that is not kept is written where its table names a block, which must be the pool's.
    // Checked per cache block, not per position: the answer is the same for every position
    // of a block but whether the position must be present (reported: the first position
    // that fails, as a per-position scan would find it).
    for (int g = 0; g < kNumLayerGroups; ++g) {
      const LayerGroup group = static_cast<LayerGroup>(g);
      if (config.NumLayersIn(group) == 0) continue;
      const int window = group == LayerGroup::kWindow ? config.window_size : 0;
      const int read_from = FirstKeptPosition(window, start);
      const int write_from = std::max(start, FirstKeptPosition(window, end));
      const int32_t* table = &b.block_tables[g][static_cast<size_t>(s) * b.blocks_per_seq];
      const int from = std::min(read_from, write_from);
      for (int blk = from / B; blk * B < end; ++blk) {
        const int lo = std::max(from, blk * B), hi = std::min(end, (blk + 1) * B);  // [lo, hi)
        const bool present = blk < b.blocks_per_seq && table[blk] != kNoBlock;
        int fails_at = -1;  // the first position of [lo, hi) that the block fails
        if (present) {
          if (table[blk] < 0 || table[blk] >= cache.num_blocks[g]) fails_at = lo;
        } else if (lo < start) {  // a cached row is read: required
          fails_at = lo;
        } else if (std::max(lo, write_from) < hi) {  // the first kept new row
          fails_at = std::max(lo, write_from);
        }  // else: only new rows that are not kept, which may go nowhere
        if (fails_at >= 0) {
          return absl::FailedPreconditionError(
              absl::StrCat("sequence ", s, ": no KV block for position ", fails_at, " in the ",
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

}  // namespace dcf
