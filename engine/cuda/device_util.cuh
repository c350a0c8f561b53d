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

// ---------------------------------------------------------------------------------------
// Vector loads: VEC (8 or 1) consecutive elements as floats (8: two float4 of f32 or one
// uint4 of 16-bit values, so `src` 16-byte aligned).

// Two 16-bit values packed in a 32-bit word (little-endian: element 0 in the low half).
__device__ __forceinline__ void Unpack2(__nv_bfloat16*, unsigned w, float& lo, float& hi) {
  lo = __uint_as_float(w << 16);
  hi = __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ void Unpack2(__half*, unsigned w, float& lo, float& hi) {
  lo = __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xffffu)));
  hi = __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
}

template <typename T, int VEC>
__device__ __forceinline__ void LoadVec(const T* __restrict__ src, float (&v)[VEC]) {
  if constexpr (VEC == 1) {
    v[0] = ToFloat(src[0]);
  } else if constexpr (sizeof(T) == 4) {
    static_assert(VEC == 8, "f32 vectors are two float4");
    const float4 x = *reinterpret_cast<const float4*>(src);
    const float4 y = *reinterpret_cast<const float4*>(src + 4);
    v[0] = x.x;
    v[1] = x.y;
    v[2] = x.z;
    v[3] = x.w;
    v[4] = y.x;
    v[5] = y.y;
    v[6] = y.z;
    v[7] = y.w;
  } else {
    static_assert(VEC == 8, "16-bit vectors are 8 elements (uint4)");
    const uint4 x = *reinterpret_cast<const uint4*>(src);
    T* tag = nullptr;
    Unpack2(tag, x.x, v[0], v[1]);
    Unpack2(tag, x.y, v[2], v[3]);
    Unpack2(tag, x.z, v[4], v[5]);
    Unpack2(tag, x.w, v[6], v[7]);
  }
}

// VEC elements as loaded, converted to floats only when used, so that many loads are in
// flight in few registers (8 16-bit values stay a uint4).
template <typename CT, int VEC>
struct RawSlice {
  float f[VEC];
  __device__ __forceinline__ void Load(const CT* src) { LoadVec<CT, VEC>(src, f); }
  __device__ __forceinline__ void Zero() {
    DCF_UNROLL
    for (int i = 0; i < VEC; ++i) f[i] = 0.0f;
  }
  __device__ __forceinline__ void Unpack(float (&v)[VEC]) const {
    DCF_UNROLL
    for (int i = 0; i < VEC; ++i) v[i] = f[i];
  }
};
template <typename CT>
struct RawSlice16 {
  uint4 u;
  __device__ __forceinline__ void Load(const CT* src) { u = *reinterpret_cast<const uint4*>(src); }
  __device__ __forceinline__ void Zero() { u = make_uint4(0u, 0u, 0u, 0u); }
  __device__ __forceinline__ void Unpack(float (&v)[8]) const {
    CT* tag = nullptr;
    Unpack2(tag, u.x, v[0], v[1]);
    Unpack2(tag, u.y, v[2], v[3]);
    Unpack2(tag, u.z, v[4], v[5]);
    Unpack2(tag, u.w, v[6], v[7]);
  }
};
template <>
struct RawSlice<__nv_bfloat16, 8> : RawSlice16<__nv_bfloat16> {};
template <>
struct RawSlice<__half, 8> : RawSlice16<__half> {};

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
