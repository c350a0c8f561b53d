// The kernels of quant_kernels.h.
#include "engine/cuda/quant_kernels.h"

#include "engine/cuda/device_util.cuh"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace {

constexpr int kThreads = 256;
constexpr float kE4M3Max = 448.0f;

// One block per row: the row's largest magnitude (a max has no order), then its codes.
template <typename T>
__global__ void __launch_bounds__(kThreads) QuantizeRowsFp8Kernel(QuantizeRowsFp8Params p) {
  DCF_SHARED(float, red, 32);
  const int row = blockIdx.x;
  const T* x = static_cast<const T*>(p.x) + row * p.ldx;
  float amax = 0.0f;
  for (int e = threadIdx.x; e < p.k; e += blockDim.x) amax = fmaxf(amax, fabsf(dev::ToFloat(x[e])));
  // The block's max: warps by butterfly, then the warps' maxima.
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(dev::kFullMask, amax, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) red[warp] = amax;
  __syncthreads();
  amax = lane < static_cast<int>(blockDim.x >> 5) ? red[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(dev::kFullMask, amax, o));
  const float inv = amax > 0.0f ? kE4M3Max / amax : 0.0f;
  const bool tiny = isinf(inv);  // amax below ~1.3e-36: divide first
  uint8_t* q = p.q + row * p.ldq;
  for (int e = threadIdx.x; e < p.ldq; e += blockDim.x) {
    uint8_t c = 0;
    if (e < p.k && amax > 0.0f) {
      const float v = dev::ToFloat(x[e]);
      c = __nv_cvt_float_to_fp8(tiny ? (v / amax) * kE4M3Max : v * inv, __NV_SATFINITE,
                                __NV_E4M3);
    } else if (e < p.k) {
      // amax is 0 (fmaxf skips NaN): zeros, but a NaN stays a NaN.
      c = isnan(dev::ToFloat(x[e])) ? 0x7f : 0;
    }
    q[e] = c;
  }
  if (threadIdx.x == 0) p.x_scale[row] = amax / kE4M3Max;
}

__device__ __forceinline__ float DecodeCode(uint8_t c, WeightType t) {
  if (t == WeightType::kI8) return static_cast<float>(static_cast<signed char>(c));
  return __half2float(__ushort_as_half(__nv_cvt_fp8_to_halfraw(c, __NV_E4M3).x));
}

template <typename T>
__global__ void __launch_bounds__(kThreads) DequantKernel(DequantRowsParams p) {
  const int64_t n = static_cast<int64_t>(p.rows) * p.k;
  T* out = static_cast<T*>(p.out);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = dev::FromFloat<T>(DecodeCode(p.w[i], p.wtype));  // exact
  }
}

struct DequantByType {
  template <typename T>
  static cudaError_t Run(const DequantRowsParams& p, cudaStream_t stream) {
    const int64_t n = static_cast<int64_t>(p.rows) * p.k;
    DCF_LAUNCH(DequantKernel<T>, dev::GridFor(n, kThreads), kThreads, 0, stream, p);
    return cudaGetLastError();
  }
};

struct QuantizeByType {
  template <typename T>
  static cudaError_t Run(const QuantizeRowsFp8Params& p, cudaStream_t stream) {
    DCF_LAUNCH(QuantizeRowsFp8Kernel<T>, p.rows, kThreads, 0, stream, p);
    return cudaGetLastError();
  }
};

__global__ void __launch_bounds__(kThreads) ScaleEpilogueKernel(ScaleEpilogueParams p) {
  const int64_t n = static_cast<int64_t>(p.rows) * p.cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = i / p.cols, c = i % p.cols;
    float v = p.sums[m * p.lds + c];
    if (p.x_scale != nullptr) v = __fmul_rn(v, p.x_scale[m]);
    v = __fmul_rn(v, p.w_scale[c]);
    if (p.bias != nullptr) v = __fadd_rn(v, p.bias[c]);
    float* y = p.y + m * p.ldy + c;
    *y = p.accumulate ? __fadd_rn(*y, v) : v;
  }
}

}  // namespace

cudaError_t LaunchQuantizeRowsFp8(const QuantizeRowsFp8Params& p, cudaStream_t stream) {
  if (p.rows < 0 || p.k <= 0 || p.ldx < p.k || p.ldq < p.k || p.x == nullptr ||
      p.q == nullptr || p.x_scale == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0) return cudaSuccess;
  return dev::DispatchElem<QuantizeByType>(p.dtype, p, stream);
}

cudaError_t LaunchDequantRows(const DequantRowsParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.k <= 0 || p.w == nullptr || p.out == nullptr ||
      (p.wtype != WeightType::kI8 && p.wtype != WeightType::kFp8)) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0) return cudaSuccess;
  return dev::DispatchElem<DequantByType>(p.dtype, p, stream);
}

cudaError_t LaunchScaleEpilogue(const ScaleEpilogueParams& p, cudaStream_t stream) {
  if (p.rows < 0 || p.cols <= 0 || p.lds < p.cols || p.ldy < p.cols || p.sums == nullptr ||
      p.w_scale == nullptr || p.y == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (p.rows == 0) return cudaSuccess;
  const int64_t n = static_cast<int64_t>(p.rows) * p.cols;
  DCF_LAUNCH(ScaleEpilogueKernel, dev::GridFor(n, kThreads), kThreads, 0, stream, p);
  return cudaGetLastError();
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
