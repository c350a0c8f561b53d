#include "engine/cuda/activation.h"
#include "engine/cuda/device_util.cuh"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void SwiGluKernel(int rows, int width, const float* __restrict__ in,
                             T* __restrict__ out) {
  const int64_t n = static_cast<int64_t>(rows) * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / width, f = i % width;
    const float g = in[r * 2 * width + f];
    const float u = in[r * 2 * width + width + f];
    out[i] = dev::FromFloat<T>(g / (1.0f + expf(-g)) * u);
  }
}

template <typename T>
__global__ void GeluKernel(int rows, int width, const float* __restrict__ in, T* __restrict__ out) {
  const int64_t n = static_cast<int64_t>(rows) * width;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float x = in[i];
    out[i] = dev::FromFloat<T>(dev::GeluErf(x));
  }
}

struct Launch {
  template <typename T>
  static cudaError_t Run(const ActivationParams& p, cudaStream_t stream) {
    const unsigned grid = dev::GridFor(static_cast<int64_t>(p.rows) * p.width, kThreads, 4096);
    T* out = static_cast<T*>(p.out);
    if (p.kind == Activation::kSwiGlu) {
      DCF_LAUNCH(SwiGluKernel<T>, grid, kThreads, 0, stream, p.rows, p.width, p.in, out);
    } else {
      DCF_LAUNCH(GeluKernel<T>, grid, kThreads, 0, stream, p.rows, p.width, p.in, out);
    }
    return cudaGetLastError();
  }
};

}  // namespace

cudaError_t LaunchActivation(const ActivationParams& p, cudaStream_t stream) {
  if (p.rows <= 0) return cudaSuccess;
  if (p.width <= 0 || p.in == nullptr || p.out == nullptr) return cudaErrorInvalidValue;
  return dev::DispatchElem<Launch>(p.out_type, p, stream);
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
