#include "engine/cuda/device_util.cuh"
#include "engine/cuda/qk_rope.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace {

constexpr int kWarps = 8;
constexpr float kQkNormEps = 1e-6f;  // fixed by the reference, independent of norm_eps

// One block per token; each warp handles one (q or k, head) vector at a time.
__global__ void QkRopeKernel(QkRopeParams p) {
  DCF_SHARED(float, buf, kWarps* kMaxQkRopeHeadDim);
  const int t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int N = p.n_head, hd = p.head_dim, half = p.rotary_dim / 2;
  const int base = warp * kMaxQkRopeHeadDim;
  const int pos = p.positions[t];
  const float* cs = p.cos_table + static_cast<int64_t>(pos) * half;
  const float* sn = p.sin_table + static_cast<int64_t>(pos) * half;
  float* row = p.qkv + static_cast<int64_t>(t) * p.stride;
  for (int item = warp; item < 2 * N; item += kWarps) {
    const bool is_k = item >= N;
    float* x = row + (is_k ? N * hd : 0) + (item % N) * hd;
    if (p.q_norm != nullptr) {
      const float* scale = is_k ? p.k_norm : p.q_norm;
      float ss = 0;
      for (int d = lane; d < hd; d += 32) ss += x[d] * x[d];
      ss = dev::WarpSum(ss);
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
    __syncwarp();
  }
}

}  // namespace

cudaError_t LaunchQkRope(const QkRopeParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return cudaSuccess;
  if (p.head_dim <= 0 || p.head_dim > kMaxQkRopeHeadDim || p.rotary_dim % 2 != 0 ||
      p.rotary_dim > p.head_dim || p.qkv == nullptr || p.positions == nullptr ||
      (p.rotary_dim > 0 && (p.cos_table == nullptr || p.sin_table == nullptr)) ||
      (p.q_norm != nullptr) != (p.k_norm != nullptr)) {
    return cudaErrorInvalidValue;
  }
  DCF_LAUNCH(QkRopeKernel, p.num_tokens, kWarps * 32, 0, stream, p);
  return cudaGetLastError();
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
