// The device math and vector types of the contract, so that both builds compile and agree.
#include "engine/simt/cuda_compat.h"
#include "tests/unit/simt/test_kernels.h"

namespace dcf::cuda_test {
inline namespace DCF_CUDA_NS {
namespace {

__global__ void MathKernel(const float* __restrict__ in, float* __restrict__ out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = __ldg(&in[i]);
  float* o = out + i * kMathFunctions;
  o[0] = expf(x);
  o[1] = __expf(x);
  o[2] = logf(x);
  o[3] = __logf(x);
  o[4] = exp2f(x);
  o[5] = log1pf(x);
  o[6] = sqrtf(x);
  o[7] = rsqrtf(x);
  o[8] = tanhf(x);
  o[9] = erff(x);
  o[10] = fmaxf(x, 1.0f);
  o[11] = fminf(x, 1.0f);
  o[12] = fabsf(-x);
  o[13] = floorf(x);
  o[14] = ceilf(x);
  o[15] = powf(x, 1.5f);
  o[16] = __fdividef(1.0f, x);
  o[17] = fmaf(x, 2.0f, 1.0f);
  o[18] = isnan(x * INFINITY - INFINITY) ? 1.0f : 0.0f;  // inf - inf
  o[19] = isinf(x * INFINITY) && !isinf(x) ? 1.0f : 0.0f;
  o[20] = __int_as_float(__float_as_int(x)) + static_cast<float>(max(1, min(3, 2)));
}

__global__ void VectorTypesKernel(const float4* __restrict__ in, float4* __restrict__ out, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float4 v = __ldg(&in[i]);
  const int2 a = make_int2(1, 2);
  const uint4 b = make_uint4(3u, 4u, 5u, 6u);
  const float2 c = make_float2(0.5f, 0.25f);
  const int4 d = make_int4(7, 8, 9, 10);
  const uint2 e = make_uint2(11u, 12u);
  v.x += static_cast<float>(a.y);
  v.y += static_cast<float>(b.w);
  v.z += c.x;
  v.w += static_cast<float>(d.z) + static_cast<float>(e.x);
  out[i] = make_float4(v.x, v.y, v.z, v.w);
}

}  // namespace

cudaError_t LaunchMath(const float* in, float* out, int n, cudaStream_t stream) {
  DCF_LAUNCH(MathKernel, (n + 127) / 128, 128, 0, stream, in, out, n);
  return cudaGetLastError();
}

cudaError_t LaunchVectorTypes(const float4* in, float4* out, int n, cudaStream_t stream) {
  DCF_LAUNCH(VectorTypesKernel, (n + 127) / 128, 128, 0, stream, in, out, n);
  return cudaGetLastError();
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda_test
