// Kernels that break the CUDA programming model, for the emulator's checks (emulator build
// only). Each launcher returns cudaGetLastError() after the launch; the k*Line constants are
// the lines of the offending calls in violation_kernels.cu.
#pragma once

#include "engine/simt/cuda_compat.h"

namespace dcf::cuda_test {

enum class Violation {
  kPartialBarrier,         // thread 3 returns before __syncthreads
  kMismatchedBarriers,     // threads < 16 and the others wait at different __syncthreads
  kSharedIndexTooLarge,    // tile[32] on a 32-element array (thread 5)
  kSharedIndexNegative,    // tile[-1] (thread 5)
  kDynamicIndexTooLarge,   // dynamic area of 64 floats indexed by threadIdx.x up to 95
  kStaticSharedTooLarge,   // 49 KiB of static shared memory
  kMaskNamesMissingLanes,  // full mask in a 40-thread block's second warp (8 lanes)
  kLaneExited,             // lane 7 returns before a full-mask __shfl_xor_sync
  kCallerNotInMask,        // lane 3 passes mask 0x1
  kReadOutsideMask,        // mask 0xffff; lane 8 shuffles down by 8 from lane 16
  kMismatchedCollectives,  // lanes 0-15 __shfl_sync, lanes 16-31 __ballot_sync, full mask
  kBarrierWhileWarpWaits,  // lane 0 at __syncthreads while lanes 1-31 __shfl_sync(full)
  kBadWidth,               // width 12
  // Shared-memory races (racecheck.h), 64 threads:
  kRaceAcrossWarps,  // s[t] = t; then s[(t + 32) % 64] read with no __syncthreads between
  kRaceWriteWrite,   // every thread writes s[0] = t
  kRaceInWarp,       // s[t] = t; then s[t ^ 1] read with no __syncwarp between
  kRaceDynamic,      // kRaceAcrossWarps on dynamic shared memory
};

// Runs the violating kernel on `block` threads (one block) writing to out[block] (host or
// device memory: the emulator does not tell them apart) and waits for it
// (cudaDeviceSynchronize): returns the launch's or the wait's error.
cudaError_t LaunchViolation(Violation v, int* out);

// Race-free uses of shared memory the racecheck must accept, 64 threads: lanes exchange
// through shared memory after __syncwarp, warps after __syncthreads, every thread
// atomicAdds into one counter and reads it after a barrier. out[t] = (t ^ 1) + ((t + 32) % 64)
// + 64; waited for.
cudaError_t LaunchRaceFree(int* out);

// A kernel whose threads recurse far past their fiber stack, waited for.
cudaError_t LaunchStackOverflow(int* out);

// A correct kernel: out[i] = i for one block of `threads` threads; queued only (the caller
// waits before reading `out`).
cudaError_t LaunchIota(int* out, int threads, size_t dynamic_bytes);

extern const int kPartialBarrierLine;
extern const int kFirstBarrierLine;
extern const int kSecondBarrierLine;
extern const int kShuffleLine;

}  // namespace dcf::cuda_test
