#include "engine/cuda/dcmha_attention.h"  // kBranches, kRank
#include "engine/cuda/device_util.cuh"
#include "engine/cuda/dyn_weights.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace {

constexpr int kThreads = 256;
constexpr int kTokens = 4;  // tokens per block (each qkw element is read once per block)
constexpr float kDynNormEps = 1e-6f;

// grid (ceil(T / kTokens), C); dynamic shared memory: u [kTokens][K] | w [kTokens][2I*N].
template <typename QT>
__global__ void DynWeightsKernel(DynWeightsParams p) {
  DCF_DYNAMIC_SHARED(float, smem);
  const int N = p.n_head, K = 4 * N, W = 2 * kRank * N;
  const int c = blockIdx.y;
  const int t0 = blockIdx.x * kTokens;
  const int nt = min(kTokens, p.num_tokens - t0);
  const int u_base = 0, w_base = kTokens * K;

  for (int i = threadIdx.x; i < kTokens * K; i += blockDim.x) {
    const int tt = i / K, k = i % K;
    smem[u_base + i] =
        tt < nt ? dev::GeluErf(p.proj[(t0 + tt) * p.stride + p.u_offset + c * K + k]) : 0.0f;
  }
  __syncthreads();
  const QT* qkw = static_cast<const QT*>(p.qkw) + static_cast<int64_t>(c) * K * W;
  for (int j = threadIdx.x; j < W; j += blockDim.x) {
    float acc[kTokens];
    for (int tt = 0; tt < kTokens; ++tt) acc[tt] = 0.0f;
    for (int k = 0; k < K; ++k) {
      const float w = dev::ToFloat(qkw[static_cast<int64_t>(k) * W + j]);
      for (int tt = 0; tt < kTokens; ++tt) acc[tt] += smem[u_base + tt * K + k] * w;
    }
    for (int tt = 0; tt < kTokens; ++tt) smem[w_base + tt * W + j] = acc[tt];
  }
  __syncthreads();
  // Normalise W1 (the first I rows of N) of each token over heads: one warp per row.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int row = warp; row < kTokens * kRank; row += warps) {
    const int tt = row / kRank, i = row % kRank;
    if (tt >= nt) continue;  // uniform across the warp
    const int off = w_base + tt * W + i * N;
    float ss = 0;
    for (int n = lane; n < N; n += 32) ss += smem[off + n] * smem[off + n];
    ss = dev::WarpSum(ss);
    const float inv = 1.0f / sqrtf(ss / N + kDynNormEps);
    for (int n = lane; n < N; n += 32) smem[off + n] *= inv;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < nt * W; i += blockDim.x) {
    const int tt = i / W, j = i % W;
    p.dyn[(t0 + tt) * p.dyn_stride + c * W + j] = smem[w_base + tt * W + j];
  }
  for (int i = threadIdx.x; i < nt * N; i += blockDim.x) {
    const int tt = i / N, n = i % N;
    float* g = p.proj + (t0 + tt) * p.stride + p.g_offset + c * N + n;
    *g = tanhf(*g);
  }
}

struct Launch {
  template <typename QT>
  static cudaError_t Run(const DynWeightsParams& p, cudaStream_t stream) {
    const int K = 4 * p.n_head, W = 2 * kRank * p.n_head;
    const size_t smem = sizeof(float) * kTokens * (K + W);
    const dim3 grid((p.num_tokens + kTokens - 1) / kTokens, kBranches);
    DCF_LAUNCH(DynWeightsKernel<QT>, grid, kThreads, smem, stream, p);
    return cudaGetLastError();
  }
};

}  // namespace

cudaError_t LaunchDynWeights(const DynWeightsParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return cudaSuccess;
  if (p.n_head <= 0 || p.n_head > kMaxDynHeads || p.proj == nullptr || p.qkw == nullptr ||
      p.dyn == nullptr) {
    return cudaErrorInvalidValue;
  }
  return dev::DispatchElem<Launch>(p.qkw_type, p, stream);
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
