#include "engine/cuda/qk_rope.h"
#include "engine/cuda/qk_rope.cuh"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace {

constexpr int kWarps = 8;

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
    dev::QkNormRopeHead(p, is_k, x, cs, sn, buf, base, lane);
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
