// The one kernel between the fused input projection and DCMHA (DCFORMER.md sections 3-4):
// qk-norm + RoPE of q and k in place, the dynamic-weight tail (u = gelu(a . dw1),
// w = u . qkw, W1 normalised over heads, G = tanh(a . dd) in place) and the KV-cache row
// write of every kept new token (K after RoPE, V, the key-side terms of branches 1 and 3),
// where the plain path ran three kernels (LaunchQkRope, LaunchDynWeights,
// LaunchKvCacheWrite; each stays as the reference this one is tested against).
//
// Grid (2N + C * 2I, T) of one warp each, so that a decode token alone spreads over
// 2N + 16 blocks (80 at N = 32): block b < N normalises and rotates q of head b; N <= b < 2N
// k of head b - N, then writes that head's K and V into the cache row; block 2N + j computes
// row r = j % 2I of branch c = j / 2I of w (N dot products of length K = 4N over qkw,
// summed in k order as LaunchDynWeights does), normalises it when it is a W1 row, and for
// r = 0 also G of branch c; key-side rows and gates go into the cache row as well. Each
// output has one writer, so the blocks need no ordering among themselves. Arithmetic is the
// plain kernels' own, operation for operation: the results are bit-identical to them.
#pragma once

#include <cstdint>

#include "engine/simt/cuda_compat.h"
#include "engine/cuda/dcmha_attention.h"
#include "engine/cuda/dyn_weights.h"
#include "engine/cuda/qk_rope.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {

struct AttentionInputParams {
  // qk-norm and RoPE (rope.qkv is the projection output, modified in place).
  QkRopeParams rope;
  // The dynamic-weight tail over the same projection rows (dyn.proj, its offsets, qkw in
  // qkw_type, the dyn output); dyn.num_tokens and dyn.n_head must equal rope's.
  DynWeightsParams dyn;
  // The KV-cache write (as LaunchKvCacheWrite: every new row whose block-table entry names a
  // block): the step's structure, the layer's cache and where in it. cache.base null: no
  // write (a test of the first two parts).
  StepView step;
  CacheView cache;
  int window = 0;          // W of a window layer, 0 for a global layer
  int layer_in_group = 0;  // the layer within the cache's group
  // V and the gates as LaunchKvCacheWrite reads them: V at rope.qkv + 2 * N * hd of each
  // row; gates = dyn.proj + dyn.g_offset (after tanh), stride dyn.stride.
};

// cudaErrorInvalidValue for inconsistent arguments (those LaunchQkRope, LaunchDynWeights and
// LaunchKvCacheWrite refuse); otherwise the launch's error.
cudaError_t LaunchAttentionInput(const AttentionInputParams& p, cudaStream_t stream);

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
