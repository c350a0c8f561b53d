// Sizing of the paged KV cache: how many blocks each layer group gets from a memory budget.
//
// Rule (documented in one place, used by the engine and the benchmark):
//  * The window group never needs more than
//        window_demand = max_num_seqs * (ceil(W/B) + 1)           (every running sequence
//                                                                  at its bound between steps)
//                      + ceil(T/B) + min(max_num_seqs, T)          (the new blocks the prefill
//                                                                  chunks of one step write
//                                                                  before Commit frees the old
//                                                                  ones; T = token budget)
//    blocks, capped by what it could ever hold: max_num_seqs * ceil(context/B).
//    It gets that many blocks when they cost at most half of the budget, else half of the
//    budget (a small budget then still leaves the global group, the one that grows with the
//    sequence length, half the memory).
//  * The global group gets the rest of the budget, capped at max_num_seqs * ceil(context/B)
//    blocks (more could never be used). What it leaves goes back to the window group, up to
//    window_demand.
//  * So the cache takes whole blocks within the budget, and never more than max_num_seqs
//    sequences can use: a budget beyond that is left unallocated (KvPlanIsCappedBySequences
//    says when, and the engine logs it).
//  * A budget below what one full-context sequence needs alone (BlocksToRunAlone: `need`
//    bytes) is refused; from `need` up no budget is: when the split above leaves a group
//    short of one sequence, that group gets what one sequence needs and the other group the
//    rest, up to its cap (the window group first, then the global one).
//  * A group without layers costs no memory: the window group then gets window_demand blocks,
//    the global group max_num_seqs * ceil(context/B) blocks.
// Pure function, thread-safe.
#pragma once

#include <array>
#include <cstddef>

#include "absl/status/statusor.h"
#include "engine/kv/kv_cache_manager.h"

namespace dcf {

struct KvPlanInput {
  size_t budget_bytes = 0;
  int block_size = 16;  // B
  int window = 0;       // W of the window group; 0: no window
  int context = 0;      // model context (max positions)
  int max_num_seqs = 1;
  int max_num_batched_tokens = 1;  // T
  std::array<size_t, kNumLayerGroups> bytes_per_block{0, 0};  // 0: the group has no layers
};

// Blocks the window group may need at most (see the rule above).
int WindowGroupDemand(const KvPlanInput& in);

// The cache shape for `in`. InvalidArgument for non-positive sizes; ResourceExhausted when the
// budget cannot hold one full-context sequence (the message gives the bytes needed: that
// budget, and every larger one, is accepted).
absl::StatusOr<KvCacheShape> PlanKvCache(const KvPlanInput& in);

// True when the budget did not limit `shape` (PlanKvCache's result for `in`): every group with
// layers got every block max_num_seqs sequences can ever use, so a larger budget would leave
// the cache as it is and only a larger max_num_seqs makes it grow.
bool KvPlanIsCappedBySequences(const KvPlanInput& in, const KvCacheShape& shape);

}  // namespace dcf
