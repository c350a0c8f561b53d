// The arithmetic of warp collectives, separate from the fiber scheduling: given what each
// participating lane brought, compute what each lane gets back. Pure functions; thread-safe.
#pragma once

#include <cstdint>

#include "engine/simt/warp_ops.h"

namespace dcf::simt::detail {

inline constexpr int kWarpSize = 32;

// What one lane passed to a collective.
struct LaneRequest {
  WarpOp op;
  unsigned int mask;
  int arg;    // shuffles: source lane, delta or lane mask
  int width;  // shuffles: segment width
  uint64_t value;
};

// The lane whose value a shuffle by `lane` returns (PTX shfl.sync: the width splits the warp
// into segments; a source past the segment's end, or before its start for `up`, is the lane
// itself; an index wraps modulo the width).
int ShuffleSourceLane(WarpOp op, int lane, int arg, int width);

// True for the shuffle ops.
bool IsShuffle(WarpOp op);

// Name as written in CUDA, e.g. "__shfl_xor_sync".
const char* WarpOpName(WarpOp op);

// Computes results[l] for every lane l in `mask` from lanes[l] (all present, same op and
// mask). Returns false when a shuffle by some lane reads a lane outside the mask (its value is
// undefined in CUDA), with that lane in *bad_lane and its source in *bad_source.
bool ResolveCollective(unsigned int mask, const LaneRequest* const lanes[kWarpSize],
                       uint64_t results[kWarpSize], int* bad_lane, int* bad_source);

}  // namespace dcf::simt::detail
