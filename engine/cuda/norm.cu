#include "engine/cuda/device_util.cuh"
#include "engine/cuda/norm.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace {

constexpr int kThreads = 256;

// One block per output row.
template <typename T>
__global__ void NormKernel(NormParams p) {
  DCF_SHARED(double, red, 32);
  const int r = blockIdx.x;
  const int in_row = p.row_index != nullptr ? p.row_index[r] : r;
  const float* x = p.x + static_cast<int64_t>(in_row) * p.dim;
  const int E = p.dim;
  float inv = 0.0f;
  double mean = 0.0;
  if (p.layer_norm) {
    double s = 0;
    for (int e = threadIdx.x; e < E; e += blockDim.x) s += x[e];
    mean = dev::BlockSum(s, red) / E;
    double v = 0;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      const double d = x[e] - mean;
      v += d * d;
    }
    const double var = dev::BlockSum(v, red) / E;
    const double inv_d = 1.0 / sqrt(var + p.eps);
    T* out = static_cast<T*>(p.out) + static_cast<int64_t>(r) * E;
    T* out2 = p.out2 != nullptr ? static_cast<T*>(p.out2) + static_cast<int64_t>(r) * E : nullptr;
    // An explicit fused multiply-add (what nvcc contracts n * w + b to anyway): the GEMV's
    // LayerNorm prologue (gemv.h) computes the same value bit for bit, whatever the host
    // compiler of an emulator build contracts.
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
      const float n = static_cast<float>((x[e] - mean) * inv_d);
      out[e] = dev::FromFloat<T>(fmaf(n, p.weight[e], p.bias != nullptr ? p.bias[e] : 0.0f));
      if (out2 != nullptr) {
        out2[e] =
            dev::FromFloat<T>(fmaf(n, p.weight2[e], p.bias2 != nullptr ? p.bias2[e] : 0.0f));
      }
    }
    return;
  }
  double ss = 0;
  for (int e = threadIdx.x; e < E; e += blockDim.x) ss += static_cast<double>(x[e]) * x[e];
  ss = dev::BlockSum(ss, red);
  inv = static_cast<float>(1.0 / sqrt(ss / E + p.eps));
  T* out = static_cast<T*>(p.out) + static_cast<int64_t>(r) * E;
  T* out2 = p.out2 != nullptr ? static_cast<T*>(p.out2) + static_cast<int64_t>(r) * E : nullptr;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const float n = x[e] * inv;
    out[e] = dev::FromFloat<T>(n * p.weight[e]);
    if (out2 != nullptr) out2[e] = dev::FromFloat<T>(n * p.weight2[e]);
  }
}

struct Launch {
  template <typename T>
  static cudaError_t Run(const NormParams& p, cudaStream_t stream) {
    DCF_LAUNCH(NormKernel<T>, p.rows, kThreads, 0, stream, p);
    return cudaGetLastError();
  }
};

}  // namespace

cudaError_t LaunchNorm(const NormParams& p, cudaStream_t stream) {
  if (p.rows <= 0) return cudaSuccess;
  if (p.dim <= 0 || p.x == nullptr || p.weight == nullptr || p.out == nullptr ||
      (p.weight2 != nullptr && p.out2 == nullptr)) {
    return cudaErrorInvalidValue;
  }
  return dev::DispatchElem<Launch>(p.out_type, p, stream);
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
