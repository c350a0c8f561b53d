// qk-norm + RoPE of one (q or k, head) vector by one warp: the steps LaunchQkRope and
// LaunchAttentionInput share, so that both compute the same bits. Included by .cu files only.
#pragma once

#include "engine/cuda/device_util.cuh"
#include "engine/cuda/qk_rope.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace dev {

inline constexpr float kQkNormEps = 1e-6f;  // fixed by the reference, independent of norm_eps

// x: the head's hd values, replaced; cs, sn: the position's rotary_dim / 2 cos and sin;
// buf: hd floats of warp-private shared memory. Every lane of the warp calls it.
template <typename Buf>
__device__ __forceinline__ void QkNormRopeHead(const QkRopeParams& p, bool is_k, float* x,
                                               const float* cs, const float* sn, Buf& buf,
                                               int base, int lane) {
  const int hd = p.head_dim, half = p.rotary_dim / 2;
  if (p.q_norm != nullptr) {
    const float* scale = is_k ? p.k_norm : p.q_norm;
    float ss = 0;
    for (int d = lane; d < hd; d += 32) ss += x[d] * x[d];
    ss = WarpSum(ss);
    const float inv = 1.0f / sqrtf(ss / hd + kQkNormEps);
    for (int d = lane; d < hd; d += 32) buf[base + d] = x[d] * inv * scale[d];
  } else {
    for (int d = lane; d < hd; d += 32) buf[base + d] = x[d];
  }
  __syncwarp();
  for (int d = lane; d < hd; d += 32) {
    if (d < half) {
      const float a = buf[base + d], b = buf[base + d + half];
      x[d] = a * cs[d] - b * sn[d];
    } else if (d < 2 * half) {
      const int j = d - half;
      const float a = buf[base + j], b = buf[base + d];
      x[d] = b * cs[j] + a * sn[j];
    } else {
      x[d] = buf[base + d];
    }
  }
}

}  // namespace dev
}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
