// The dynamic-weight tail of DCMHA (DCFORMER.md section 4), after the fused projection GEMM
// has produced, per token, the pre-activations a . dw1 ([C, K]) and a . dd ([C, N]):
//   u = gelu_erf(a . dw1)                               [C, K]
//   w[c] = u[c] . qkw[c]                                [C, 2I, N]  (W1 = w[c, :I], W2 = w[c, I:])
//   W1[c, i, :] /= sqrt(mean_n W1[c, i, n]^2 + 1e-6)    (over heads, no scale)
//   G = tanh(a . dd)                                    [C, N]      (in place)
// and writes w in the `dyn` layout of dcmha_attention.h ([T, C, 2I, N] f32).
//
// The qkw product ([K] x [K, 2I*N] per token and branch, 64K MACs per token for N = 32) is
// a small kernel rather than a batched GEMM: it fuses the GELU before and the normalisation
// after, and one block reuses each qkw column for several tokens. The backend's layer loop
// runs the fused LaunchAttentionInput (attention_input.h) instead; this kernel is the plain
// path that one is tested against.
#pragma once

#include <cstdint>

#include "engine/simt/cuda_compat.h"
#include "engine/cuda/dcmha_attention.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {

// Largest n_head the kernel supports (its shared memory holds K = 4N values per token).
inline constexpr int kMaxDynHeads = 256;

struct DynWeightsParams {
  int num_tokens = 0;     // T
  int n_head = 0;         // N; K = 4N, branch width 2I*N = 4N
  float* proj = nullptr;  // row t at proj + t * stride (f32):
  int64_t stride = 0;     //   [u_offset, +C*K): a . dw1, read
  int64_t u_offset = 0;   //   [g_offset, +C*N): a . dd, replaced by tanh(a . dd)
  int64_t g_offset = 0;
  const void* qkw = nullptr;  // [C, K, 2I*N] of qkw_type
  ElemType qkw_type = ElemType::kF32;
  float* dyn = nullptr;        // row t at dyn + t * dyn_stride: [C, 2I, N] f32
  int64_t dyn_stride = 0;
};

cudaError_t LaunchDynWeights(const DynWeightsParams& p, cudaStream_t stream);

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
