// The index built-ins of a kernel in the SIMT emulator: threadIdx, blockIdx, blockDim,
// gridDim and warpSize. They read the coordinates of the fiber that is running on this OS
// thread; the block runner (block_runner.h) points them at the right thread on every switch.
// They are valid only inside a kernel launched with DCF_LAUNCH; elsewhere they dereference
// null.
#pragma once

#include "engine/simt/vector_types.h"

namespace dcf::simt {

inline constexpr int warpSize = 32;

namespace detail {

// Per-block values shared by all threads of the block being run on this OS thread.
struct BlockCoords {
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};

// Set by the block runner; fibers never move between OS threads, so a thread_local is right.
inline constinit thread_local const uint3* current_thread_idx = nullptr;
inline constinit thread_local const BlockCoords* current_block = nullptr;

}  // namespace detail
}  // namespace dcf::simt

using dcf::simt::warpSize;

#define threadIdx (*::dcf::simt::detail::current_thread_idx)
#define blockIdx (::dcf::simt::detail::current_block->block_idx)
#define blockDim (::dcf::simt::detail::current_block->block_dim)
#define gridDim (::dcf::simt::detail::current_block->grid_dim)
