#include "engine/simt/warp_collective.h"

namespace dcf::simt::detail {

bool IsShuffle(WarpOp op) {
  return op == WarpOp::kShflIdx || op == WarpOp::kShflUp || op == WarpOp::kShflDown ||
         op == WarpOp::kShflXor;
}

const char* WarpOpName(WarpOp op) {
  switch (op) {
    case WarpOp::kSyncWarp:
      return "__syncwarp";
    case WarpOp::kShflIdx:
      return "__shfl_sync";
    case WarpOp::kShflUp:
      return "__shfl_up_sync";
    case WarpOp::kShflDown:
      return "__shfl_down_sync";
    case WarpOp::kShflXor:
      return "__shfl_xor_sync";
    case WarpOp::kBallot:
      return "__ballot_sync";
    case WarpOp::kAny:
      return "__any_sync";
    case WarpOp::kAll:
      return "__all_sync";
  }
  return "?";
}

int ShuffleSourceLane(WarpOp op, int lane, int arg, int width) {
  // CUDA passes c = ((32 - width) << 8) | (up ? 0 : 0x1f) to shfl.sync; this follows the
  // PTX definition of how c bounds the source lane.
  const int segment_mask = (kWarpSize - width) & 0x1f;  // lane bits that select the segment
  const int clamp = op == WarpOp::kShflUp ? 0 : 0x1f;
  const int min_lane = lane & segment_mask;
  const int max_lane = min_lane | (clamp & ~segment_mask);
  const int b = arg & 0x1f;
  int source = lane;
  bool valid = false;
  switch (op) {
    case WarpOp::kShflUp:
      source = lane - b;
      valid = source >= max_lane;
      break;
    case WarpOp::kShflDown:
      source = lane + b;
      valid = source <= max_lane;
      break;
    case WarpOp::kShflXor:
      source = lane ^ b;
      valid = source <= max_lane;
      break;
    case WarpOp::kShflIdx:
      source = min_lane | (b & ~segment_mask);
      valid = source <= max_lane;
      break;
    default:
      break;
  }
  return valid ? source : lane;
}

bool ResolveCollective(unsigned int mask, const LaneRequest* const lanes[kWarpSize],
                       uint64_t results[kWarpSize], int* bad_lane, int* bad_source) {
  const WarpOp op = lanes[__builtin_ctz(mask)]->op;
  if (IsShuffle(op)) {
    for (int lane = 0; lane < kWarpSize; ++lane) {
      if (!(mask >> lane & 1u)) continue;
      const LaneRequest& r = *lanes[lane];
      const int source = ShuffleSourceLane(op, lane, r.arg, r.width);
      if (!(mask >> source & 1u)) {
        *bad_lane = lane;
        *bad_source = source;
        return false;
      }
      results[lane] = lanes[source]->value;
    }
    return true;
  }
  unsigned int ballot = 0;
  for (int lane = 0; lane < kWarpSize; ++lane) {
    if ((mask >> lane & 1u) && lanes[lane]->value != 0) ballot |= 1u << lane;
  }
  uint64_t result = 0;
  if (op == WarpOp::kBallot) result = ballot;
  if (op == WarpOp::kAny) result = ballot != 0;
  if (op == WarpOp::kAll) result = ballot == mask;
  for (int lane = 0; lane < kWarpSize; ++lane) {
    if (mask >> lane & 1u) results[lane] = result;
  }
  return true;
}

}  // namespace dcf::simt::detail
