#include "engine/kv/kv_cache_planner.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace dcf {
namespace {

int CeilDiv(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

}  // namespace

int WindowGroupDemand(const KvPlanInput& in) {
  const int B = in.block_size;
  const int64_t full = static_cast<int64_t>(in.max_num_seqs) * CeilDiv(in.context, B);
  if (in.window <= 0) return static_cast<int>(full);
  const int64_t demand = static_cast<int64_t>(in.max_num_seqs) * (CeilDiv(in.window, B) + 1) +
                         CeilDiv(in.max_num_batched_tokens, B) +
                         std::min(in.max_num_seqs, in.max_num_batched_tokens);
  return static_cast<int>(std::min(demand, full));
}

absl::StatusOr<KvCacheShape> PlanKvCache(const KvPlanInput& in) {
  if (in.block_size <= 0) return absl::InvalidArgumentError("block_size must be positive");
  if (in.context <= 0) return absl::InvalidArgumentError("model context must be positive");
  if (in.max_num_seqs <= 0) return absl::InvalidArgumentError("max_num_seqs must be positive");
  if (in.max_num_batched_tokens <= 0) {
    return absl::InvalidArgumentError("max_num_batched_tokens must be positive");
  }
  const int B = in.block_size;
  const int context_blocks = CeilDiv(in.context, B);
  const int64_t max_useful = static_cast<int64_t>(in.max_num_seqs) * context_blocks;
  const size_t bg = in.bytes_per_block[static_cast<int>(LayerGroup::kGlobal)];
  const size_t bw = in.bytes_per_block[static_cast<int>(LayerGroup::kWindow)];

  KvCacheShape shape;
  shape.block_size = B;
  shape.window = in.window;
  const int64_t window_demand = WindowGroupDemand(in);
  int64_t window_blocks = window_demand;
  if (bw > 0 && window_blocks * bw > in.budget_bytes / 2) {
    window_blocks = static_cast<int64_t>(in.budget_bytes / 2 / bw);
  }
  int64_t global_blocks = max_useful;
  if (bg > 0) {
    const size_t left = in.budget_bytes - static_cast<size_t>(window_blocks) * bw;
    global_blocks = std::min<int64_t>(max_useful, static_cast<int64_t>(left / bg));
  }
  if (bw > 0 && window_blocks < window_demand) {
    // The global group is at its cap: what it left over is the window group's.
    const size_t used =
        static_cast<size_t>(window_blocks) * bw + static_cast<size_t>(global_blocks) * bg;
    window_blocks = std::min<int64_t>(
        window_demand, window_blocks + static_cast<int64_t>((in.budget_bytes - used) / bw));
  }
  // One sequence of the full context must fit, or no request of that length could ever run.
  const std::array<int, kNumLayerGroups> one = BlocksToRunAlone(shape, in.context);
  const int global_one = one[static_cast<int>(LayerGroup::kGlobal)];
  const int window_one = one[static_cast<int>(LayerGroup::kWindow)];
  const size_t need = static_cast<size_t>(global_one) * bg + static_cast<size_t>(window_one) * bw;
  if (in.budget_bytes < need) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache budget of ", in.budget_bytes, " bytes cannot hold one sequence of ",
                     in.context, " tokens (needs at least ", need, " bytes)"));
  }
  // The split above can leave a group short of one sequence while the budget holds both: the
  // short group then gets what one sequence needs and the other group the rest (up to its
  // cap), so every budget from `need` up is served and the message above states the true
  // minimum.
  if (window_blocks < window_one) {
    if (bg > 0) {
      global_blocks = std::min<int64_t>(
          max_useful, static_cast<int64_t>((in.budget_bytes - window_one * bw) / bg));
    }
    const size_t left = in.budget_bytes - static_cast<size_t>(global_blocks) * bg;
    window_blocks = std::min<int64_t>(window_demand, static_cast<int64_t>(left / bw));
  } else if (global_blocks < global_one) {
    global_blocks = global_one;
    if (bw > 0) {
      window_blocks = std::min<int64_t>(
          window_demand, static_cast<int64_t>((in.budget_bytes - global_one * bg) / bw));
    }
  }
  shape.num_blocks[static_cast<int>(LayerGroup::kGlobal)] = static_cast<int>(global_blocks);
  shape.num_blocks[static_cast<int>(LayerGroup::kWindow)] = static_cast<int>(window_blocks);
  return shape;
}

bool KvPlanIsCappedBySequences(const KvPlanInput& in, const KvCacheShape& shape) {
  const int64_t max_useful =
      static_cast<int64_t>(in.max_num_seqs) * CeilDiv(in.context, in.block_size);
  const bool global_capped = in.bytes_per_block[static_cast<int>(LayerGroup::kGlobal)] == 0 ||
                             shape.num_blocks[static_cast<int>(LayerGroup::kGlobal)] >= max_useful;
  const bool window_capped =
      in.bytes_per_block[static_cast<int>(LayerGroup::kWindow)] == 0 ||
      shape.num_blocks[static_cast<int>(LayerGroup::kWindow)] >= WindowGroupDemand(in);
  return global_capped && window_capped;
}

}  // namespace dcf
