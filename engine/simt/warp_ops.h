// Block barriers and warp collectives for the SIMT emulator:
//   __syncthreads(), __syncwarp(mask),
//   __shfl_sync / __shfl_up_sync / __shfl_down_sync / __shfl_xor_sync for int, unsigned int,
//     long, unsigned long, long long, unsigned long long, float, double, __half, __nv_bfloat16,
//   __ballot_sync, __any_sync, __all_sync.
// Each one suspends the calling fiber until its partners arrive (block_runner.h), so the
// threads of a block interleave only here. Warps are 32 consecutive linear thread ids
// (x fastest, then y, then z). The shuffles follow PTX shfl.sync exactly, including `width`
// sub-warps and the "source outside the segment returns your own value" rules.
//
// Every call records its call site (std::source_location) so that a violation names it:
// a barrier reached by only part of the block or at different call sites, a collective whose
// mask names lanes that do not exist, have exited or wait elsewhere, a mask without the
// calling lane, a shuffle that reads a lane outside the mask, a width that is not a power of
// two in [1, 32]. A violation stops the launch (error_state.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <source_location>

#include "engine/simt/half_types.h"

namespace dcf::simt {
namespace detail {

enum class WarpOp : uint8_t {
  kSyncWarp,
  kShflIdx,
  kShflUp,
  kShflDown,
  kShflXor,
  kBallot,
  kAny,
  kAll,
};

// Blocks the calling thread until every thread of the block reached this call site.
void SyncThreads(const std::source_location& where);

// Blocks until every lane named in `mask` reached a collective of the same kind with the
// same mask, then returns this lane's result: for shuffles the source lane's `value` bits,
// for votes the ballot / any / all result. `arg` is the source lane, delta or lane mask.
uint64_t WarpCollective(WarpOp op, unsigned int mask, uint64_t value, int arg, int width,
                        const std::source_location& where);

template <typename T>
inline T Shuffle(WarpOp op, unsigned int mask, T var, int arg, int width,
                 const std::source_location& where) {
  static_assert(sizeof(T) <= sizeof(uint64_t));
  uint64_t bits = 0;
  std::memcpy(&bits, &var, sizeof(T));
  bits = WarpCollective(op, mask, bits, arg, width, where);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

}  // namespace detail

inline void __syncthreads(std::source_location where = std::source_location::current()) {
  detail::SyncThreads(where);
}

inline void __syncwarp(unsigned int mask = 0xffffffffu,
                       std::source_location where = std::source_location::current()) {
  detail::WarpCollective(detail::WarpOp::kSyncWarp, mask, 0, 0, 32, where);
}

#define DCF_SIMT_DEFINE_SHUFFLES(T)                                                              \
  inline T __shfl_sync(unsigned int mask, T var, int src_lane, int width = 32,                   \
                       std::source_location where = std::source_location::current()) {           \
    return detail::Shuffle(detail::WarpOp::kShflIdx, mask, var, src_lane, width, where);         \
  }                                                                                              \
  inline T __shfl_up_sync(unsigned int mask, T var, unsigned int delta, int width = 32,          \
                          std::source_location where = std::source_location::current()) {        \
    return detail::Shuffle(detail::WarpOp::kShflUp, mask, var, static_cast<int>(delta), width,   \
                           where);                                                               \
  }                                                                                              \
  inline T __shfl_down_sync(unsigned int mask, T var, unsigned int delta, int width = 32,        \
                            std::source_location where = std::source_location::current()) {      \
    return detail::Shuffle(detail::WarpOp::kShflDown, mask, var, static_cast<int>(delta), width, \
                           where);                                                               \
  }                                                                                              \
  inline T __shfl_xor_sync(unsigned int mask, T var, int lane_mask, int width = 32,              \
                           std::source_location where = std::source_location::current()) {       \
    return detail::Shuffle(detail::WarpOp::kShflXor, mask, var, lane_mask, width, where);        \
  }

DCF_SIMT_DEFINE_SHUFFLES(int)
DCF_SIMT_DEFINE_SHUFFLES(unsigned int)
DCF_SIMT_DEFINE_SHUFFLES(long)
DCF_SIMT_DEFINE_SHUFFLES(unsigned long)
DCF_SIMT_DEFINE_SHUFFLES(long long)
DCF_SIMT_DEFINE_SHUFFLES(unsigned long long)
DCF_SIMT_DEFINE_SHUFFLES(float)
DCF_SIMT_DEFINE_SHUFFLES(double)
DCF_SIMT_DEFINE_SHUFFLES(__half)
DCF_SIMT_DEFINE_SHUFFLES(__nv_bfloat16)
#undef DCF_SIMT_DEFINE_SHUFFLES

inline unsigned int __ballot_sync(unsigned int mask, int predicate,
                                  std::source_location where = std::source_location::current()) {
  return static_cast<unsigned int>(
      detail::WarpCollective(detail::WarpOp::kBallot, mask, predicate != 0, 0, 32, where));
}
inline int __any_sync(unsigned int mask, int predicate,
                      std::source_location where = std::source_location::current()) {
  return static_cast<int>(
      detail::WarpCollective(detail::WarpOp::kAny, mask, predicate != 0, 0, 32, where));
}
inline int __all_sync(unsigned int mask, int predicate,
                      std::source_location where = std::source_location::current()) {
  return static_cast<int>(
      detail::WarpCollective(detail::WarpOp::kAll, mask, predicate != 0, 0, 32, where));
}

}  // namespace dcf::simt

using dcf::simt::__all_sync;
using dcf::simt::__any_sync;
using dcf::simt::__ballot_sync;
using dcf::simt::__shfl_down_sync;
using dcf::simt::__shfl_sync;
using dcf::simt::__shfl_up_sync;
using dcf::simt::__shfl_xor_sync;
using dcf::simt::__syncthreads;
using dcf::simt::__syncwarp;
