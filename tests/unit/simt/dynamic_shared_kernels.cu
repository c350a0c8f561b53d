// Dynamic shared memory, one area viewed as two element types.
#include "engine/simt/cuda_compat.h"
#include "tests/unit/simt/test_kernels.h"

namespace dcf::cuda_test {
inline namespace DCF_CUDA_NS {
namespace {

__global__ void ReverseDynamicKernel(const float* __restrict__ in, float* __restrict__ out,
                                     int* __restrict__ src) {
  DCF_DYNAMIC_SHARED(float, values);   // [blockDim.x] f32
  DCF_DYNAMIC_SHARED(int, positions);  // [blockDim.x] i32, after the floats
  const int n = blockDim.x;
  const int base = blockIdx.x * n;
  const int t = threadIdx.x;
  values[t] = in[base + t];
  positions[n + t] = base + t;
  __syncthreads();
  out[base + t] = values[n - 1 - t];
  src[base + t] = positions[n + (n - 1 - t)];
}

}  // namespace

cudaError_t LaunchReverseDynamic(const float* in, float* out, int* src, int blocks, int threads,
                                 size_t dynamic_bytes, bool opt_in, cudaStream_t stream) {
  if (opt_in) {
    const cudaError_t e =
        cudaFuncSetAttribute(ReverseDynamicKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(dynamic_bytes));
    if (e != cudaSuccess) return e;
  }
  DCF_LAUNCH(ReverseDynamicKernel, blocks, threads, dynamic_bytes, stream, in, out, src);
  return cudaGetLastError();
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda_test
