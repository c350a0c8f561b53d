// Device helpers shared by the CUDA backend's kernels (the DCMHA kernels add theirs in
// dcmha_device.cuh): element conversion and warp / block reductions. Included by .cu files
// only.
#pragma once

#include <cstdint>

#include "engine/simt/cuda_compat.h"
#include "engine/cuda/dcmha_attention.h"

// Loop unrolling in both builds (g++ would warn about nvcc's plain `#pragma unroll`).
#if defined(__CUDACC__)
#define DCF_UNROLL _Pragma("unroll")
#else
#define DCF_UNROLL _Pragma("GCC unroll 16")
#endif

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace dev {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float ToFloat(float x) { return x; }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float ToFloat(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ float FromFloat<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}

// GELU with erf, as the reference (and cpu::GeluErf) computes it.
__device__ __forceinline__ float GeluErf(float x) {
  return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f));
}

template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
template <typename T>
__device__ __forceinline__ T WarpMax(T v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024 threads); every thread gets
// the result. `smem` holds at least 32 elements of T. Contains __syncthreads: every thread
// of the block must call it.
template <typename T, typename Smem>
__device__ T BlockSum(T v, Smem& smem) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = WarpSum(v);
  __syncthreads();  // smem may still be read by a previous reduction
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  T total = lane < warps ? smem[lane] : T(0);
  return WarpSum(total);
}

// Dispatches `F::template Run<T>(args...)` on the element type of a runtime ElemType.
template <typename F, typename... Args>
cudaError_t DispatchElem(ElemType type, Args&&... args) {
  switch (type) {
    case ElemType::kF32:
      return F::template Run<float>(args...);
    case ElemType::kBF16:
      return F::template Run<__nv_bfloat16>(args...);
    case ElemType::kF16:
      return F::template Run<__half>(args...);
  }
  return cudaErrorInvalidValue;
}

// Blocks for a grid-stride loop over n elements.
inline unsigned GridFor(int64_t n, int threads, unsigned cap = 65535u * 8u) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned>(blocks < cap ? blocks : cap);
}

}  // namespace dev
}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
