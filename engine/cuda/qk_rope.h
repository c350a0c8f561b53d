// qk-norm and rotary position embedding of the fresh queries and keys, in place in the
// projection output (DCFORMER.md section 3): per head, q = q / sqrt(mean(q^2) + 1e-6) *
// q_norm (same for k; eps fixed by the reference), then half-pairing RoPE of the first
// rotary_dim dims (dims j and j + r/2 rotate together; dims >= r pass through).
#pragma once

#include <cstdint>

#include "engine/simt/cuda_compat.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {

// Largest head_dim the kernel supports (one warp's staging row in shared memory).
inline constexpr int kMaxQkRopeHeadDim = 256;

struct QkRopeParams {
  int num_tokens = 0;                  // T
  int n_head = 0;                      // N
  int head_dim = 0;                    // hd <= kMaxQkRopeHeadDim
  int rotary_dim = 0;                  // r (even, <= hd)
  float* qkv = nullptr;                // row t at qkv + t * stride: q [N, hd] | k [N, hd] | ...
  int64_t stride = 0;                  //   f32, modified in place (q and k only)
  const float* q_norm = nullptr;       // [hd] f32, or null: no qk-norm
  const float* k_norm = nullptr;       // [hd] f32 (with q_norm)
  const int32_t* positions = nullptr;  // [T]
  // Angles of every position, computed on the host in double as the CPU does
  // (cpu::RopeAngles): [max_positions, r/2] f32 each.
  const float* cos_table = nullptr;
  const float* sin_table = nullptr;
};

cudaError_t LaunchQkRope(const QkRopeParams& p, cudaStream_t stream);

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
