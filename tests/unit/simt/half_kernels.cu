// bf16 and half conversions on the device.
#include "engine/simt/cuda_compat.h"
#include "tests/unit/simt/test_kernels.h"

namespace dcf::cuda_test {
inline namespace DCF_CUDA_NS {
namespace {

__global__ void FloatToHalfsKernel(const float* __restrict__ in, unsigned short* __restrict__ bf16,
                                   unsigned short* __restrict__ half, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  bf16[i] = __bfloat16_as_ushort(__float2bfloat16(in[i]));
  half[i] = __half_as_ushort(__float2half(in[i]));
}

__global__ void HalfsToFloatKernel(float* __restrict__ from_bf16, float* __restrict__ from_half) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned short bits = static_cast<unsigned short>(i);
  from_bf16[i] = __bfloat162float(__ushort_as_bfloat16(bits));
  from_half[i] = __half2float(__ushort_as_half(bits));
}

}  // namespace

cudaError_t LaunchFloatToHalfs(const float* in, unsigned short* bf16, unsigned short* half, int n,
                               cudaStream_t stream) {
  DCF_LAUNCH(FloatToHalfsKernel, (n + 255) / 256, 256, 0, stream, in, bf16, half, n);
  return cudaGetLastError();
}

cudaError_t LaunchHalfsToFloat(float* from_bf16, float* from_half, cudaStream_t stream) {
  DCF_LAUNCH(HalfsToFloatKernel, 65536 / 256, 256, 0, stream, from_bf16, from_half);
  return cudaGetLastError();
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda_test
