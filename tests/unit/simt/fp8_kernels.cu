// fp8 E4M3 conversions on the device.
#include "engine/simt/cuda_compat.h"
#include "tests/unit/simt/test_kernels.h"

namespace dcf::cuda_test {
inline namespace DCF_CUDA_NS {
namespace {

__global__ void FloatToFp8Kernel(const float* __restrict__ in, unsigned char* __restrict__ sat,
                                 unsigned char* __restrict__ nosat,
                                 unsigned char* __restrict__ ctor, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  sat[i] = __nv_cvt_float_to_fp8(in[i], __NV_SATFINITE, __NV_E4M3);
  nosat[i] = __nv_cvt_float_to_fp8(in[i], __NV_NOSAT, __NV_E4M3);
  ctor[i] = __nv_fp8_e4m3(in[i]).__x;
}

__global__ void Fp8ToHalfKernel(unsigned short* __restrict__ half,
                                unsigned short* __restrict__ pair, float* __restrict__ value) {
  const int i = threadIdx.x;  // one block of 256 threads: every code
  const __nv_fp8_storage_t code = static_cast<__nv_fp8_storage_t>(i);
  half[i] = __nv_cvt_fp8_to_halfraw(code, __NV_E4M3).x;
  // The pair form: code i in the low byte, code 255 - i in the high one.
  const __half2_raw two = __nv_cvt_fp8x2_to_halfraw2(
      static_cast<__nv_fp8x2_storage_t>(i | ((255 - i) << 8)), __NV_E4M3);
  pair[2 * i] = two.x;
  pair[2 * i + 1] = two.y;
  __nv_fp8_e4m3 f;
  f.__x = code;
  value[i] = static_cast<float>(f);
}

}  // namespace

cudaError_t LaunchFloatToFp8(const float* in, unsigned char* sat, unsigned char* nosat,
                             unsigned char* ctor, int n, cudaStream_t stream) {
  DCF_LAUNCH(FloatToFp8Kernel, (n + 255) / 256, 256, 0, stream, in, sat, nosat, ctor, n);
  return cudaGetLastError();
}

cudaError_t LaunchFp8ToHalf(unsigned short* half, unsigned short* pair, float* value,
                            cudaStream_t stream) {
  DCF_LAUNCH(Fp8ToHalfKernel, 1, 256, 0, stream, half, pair, value);
  return cudaGetLastError();
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda_test
