// The GEMV kernel of gemv.h, shared by the .cu files that instantiate it for one weight
// storage each (gemv.cu: weights in the compute dtype; gemv_int8.cu, gemv_fp8.cu: 1-byte
// codes with per-channel scales), so that the three compile in parallel. Included by those
// .cu files only.
#pragma once

#include <type_traits>

#include "engine/cuda/device_util.cuh"
#include "engine/cuda/gemv.h"

// DCF_UNROLL on a GPU; on the emulator the loops are left to g++'s own unrolling: full
// unrolls of 150 instantiations (3 types x 2 vector widths x 5 row counts x 5 prologue and
// epilogue forms, up to 4 x 16 x 2 x 8 multiply-adds a step) took g++ 193 s for one file
// (15 s without, and the same test times). Unrolling changes no result: every sum keeps its
// order, and each a * b + c stays one statement for -ffp-contract.
#if defined(__CUDACC__)
#define DCF_GEMV_UNROLL DCF_UNROLL
#else
#define DCF_GEMV_UNROLL
#endif

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace gemv_detail {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kVecElems = 8;        // 16 bytes of 16-bit values, 32 of f32, 8 of 1-byte codes
constexpr int kTargetBlocks = 264;  // two waves of 132 SMs

struct Params {
  GemmArgs a;
  GemvOut o;
  GemvIn in;
  int features;   // outputs per row: n, or n / 2 for kSwiGlu
  int per_block;  // features per block
};

// The prologue (gemv.h, GemvIn): none, RMSNorm (dcformer) or LayerNorm (dcpythia).
constexpr int kNoNorm = 0, kRmsNorm = 1, kLayerNorm = 2;

// The element types of the weight storages: the compute dtype's own (Dense: TW = void), or a
// 1-byte code.
struct Int8Code {
  signed char q;
};
using Fp8Code = __nv_fp8_e4m3;

// Eight 1-byte codes, loaded as one 8-byte word and decoded to floats exactly when used.
__device__ __forceinline__ void Decode8(const Int8Code*, uint2 u, float (&v)[8]) {
  DCF_UNROLL
  for (int i = 0; i < 4; ++i) {
    v[i] = static_cast<float>(static_cast<signed char>((u.x >> (8 * i)) & 0xffu));
    v[4 + i] = static_cast<float>(static_cast<signed char>((u.y >> (8 * i)) & 0xffu));
  }
}
__device__ __forceinline__ void Decode8(const Fp8Code*, uint2 u, float (&v)[8]) {
  DCF_UNROLL
  for (int i = 0; i < 2; ++i) {
    const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(
        static_cast<__nv_fp8x2_storage_t>((u.x >> (16 * i)) & 0xffffu), __NV_E4M3);
    const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(
        static_cast<__nv_fp8x2_storage_t>((u.y >> (16 * i)) & 0xffffu), __NV_E4M3);
    v[2 * i] = __half2float(__ushort_as_half(lo.x));
    v[2 * i + 1] = __half2float(__ushort_as_half(lo.y));
    v[4 + 2 * i] = __half2float(__ushort_as_half(hi.x));
    v[4 + 2 * i + 1] = __half2float(__ushort_as_half(hi.y));
  }
}
// VEC weights of type W as loaded, decoded when used: the compute dtype's slices
// (dev::RawSlice), or 8 codes in an 8-byte word (codes have no scalar form: LaunchGemv
// takes quantized weights with aligned rows only).
template <typename W, int VEC,
          bool kCode = std::is_same_v<W, Int8Code> || std::is_same_v<W, Fp8Code>>
struct WeightSlice : dev::RawSlice<W, VEC> {};
template <typename W>
struct WeightSlice<W, kVecElems, true> {
  uint2 u;
  __device__ __forceinline__ void Load(const W* src) { u = *reinterpret_cast<const uint2*>(src); }
  __device__ __forceinline__ void Zero() { u = make_uint2(0u, 0u); }
  __device__ __forceinline__ void Unpack(float (&v)[kVecElems]) const {
    const W* tag = nullptr;
    Decode8(tag, u, v);
  }
};

// act[at] = v in `type` (the epilogues that write the activation, as LaunchActivation does).
__device__ __forceinline__ void StoreAct(void* act, ElemType type, int64_t at, float v) {
  switch (type) {
    case ElemType::kF32:
      static_cast<float*>(act)[at] = v;
      break;
    case ElemType::kBF16:
      static_cast<__nv_bfloat16*>(act)[at] = __float2bfloat16_rn(v);
      break;
    case ElemType::kF16:
      static_cast<__half*>(act)[at] = __float2half_rn(v);
      break;
  }
}

// Row `row` of x (type T) or w (T, or the 1-byte codes TW with a scale per output) as
// VEC-element slices; P weight rows per feature (2 for SwiGLU); NORM: the prologue
// (kNoNorm, kRmsNorm or kLayerNorm).
template <typename T, typename TW, int VEC, int MT, int P, int NORM>
__global__ void __launch_bounds__(kThreads) GemvKernel(Params p) {
  using W = std::conditional_t<std::is_void_v<TW>, T, TW>;
  constexpr bool kScaled = !std::is_void_v<TW>;
  // Slices in flight per lane: 1-byte codes take twice as many to keep as many bytes
  // in flight (the order of the sums is that of k either way).
  constexpr int kUnroll = sizeof(W) == 1 ? 2 * kGemvUnroll : kGemvUnroll;
  DCF_SHARED(float, red, kWarps * 2 * kGemvMaxRows);  // [warp][P][MT] partial sums
  const GemmArgs& a = p.a;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int team_warps = kWarps / p.per_block;  // warps sharing a feature's K
  const int slot = warp / team_warps, slice = warp % team_warps;
  const int j = blockIdx.x * p.per_block + slot;
  const bool live = j < p.features;  // uniform across the warp
  const int M = a.m;
  const int64_t K = a.k;
  const T* x = static_cast<const T*>(a.x);
  const float* xf = static_cast<const float*>(a.x);  // NORM: the f32 rows
  int64_t x_at[MT];  // where row mm of x starts (GemvIn::row_index's gather)
  DCF_GEMV_UNROLL
  for (int mm = 0; mm < MT; ++mm) {
    x_at[mm] = mm < M ? (p.in.row_index != nullptr ? p.in.row_index[mm] : mm) * a.ldx : 0;
  }
  float inv[MT];      // kRmsNorm: each row's 1 / rms, as NormKernel computes it
  double mean[MT];    // kLayerNorm: each row's mean and 1 / sqrt(var + eps), as NormKernel
  double inv_sd[MT];  //   computes them (f64, the same 256-thread order)
  if constexpr (NORM == kRmsNorm) {
    DCF_SHARED(double, red_norm, 32);
    DCF_GEMV_UNROLL
    for (int mm = 0; mm < MT; ++mm) {
      inv[mm] = 0.0f;
      if (mm < M) {  // uniform across the block
        const float* row = xf + x_at[mm];
        double ss = 0;
        for (int64_t e = threadIdx.x; e < a.k; e += blockDim.x) {
          ss += static_cast<double>(row[e]) * row[e];
        }
        ss = dev::BlockSum(ss, red_norm);
        inv[mm] = static_cast<float>(1.0 / sqrt(ss / a.k + p.in.eps));
      }
    }
  } else if constexpr (NORM == kLayerNorm) {
    DCF_SHARED(double, red_norm, 32);
    DCF_GEMV_UNROLL
    for (int mm = 0; mm < MT; ++mm) {
      mean[mm] = 0.0;
      inv_sd[mm] = 0.0;
      if (mm < M) {  // uniform across the block
        const float* row = xf + x_at[mm];
        double s = 0;
        for (int64_t e = threadIdx.x; e < a.k; e += blockDim.x) s += row[e];
        mean[mm] = dev::BlockSum(s, red_norm) / a.k;
        double v = 0;
        for (int64_t e = threadIdx.x; e < a.k; e += blockDim.x) {
          const double d = row[e] - mean[mm];
          v += d * d;
        }
        const double var = dev::BlockSum(v, red_norm) / a.k;
        inv_sd[mm] = 1.0 / sqrt(var + p.in.eps);
      }
    }
  }
  const W* w[P];
  DCF_GEMV_UNROLL
  for (int q = 0; q < P; ++q) {
    w[q] = static_cast<const W*>(a.w) + (live ? j + static_cast<int64_t>(q) * p.features : 0) * K;
  }
  float acc[P][MT];
  DCF_GEMV_UNROLL
  for (int q = 0; q < P; ++q) {
    DCF_GEMV_UNROLL
    for (int mm = 0; mm < MT; ++mm) acc[q][mm] = 0.0f;
  }
  const int64_t step = static_cast<int64_t>(team_warps) * 32 * VEC;
  if (live) {
    for (int64_t k0 = (static_cast<int64_t>(slice) * 32 + lane) * VEC; k0 < K;
         k0 += step * kUnroll) {
      // kUnroll slices of each weight row in flight before any is used.
      WeightSlice<W, VEC> wv[kUnroll][P];
      DCF_GEMV_UNROLL
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t kk = k0 + u * step;
        DCF_GEMV_UNROLL
        for (int q = 0; q < P; ++q) {
          if (kk < K) {
            wv[u][q].Load(w[q] + kk);
          } else {
            wv[u][q].Zero();
          }
        }
      }
      DCF_GEMV_UNROLL
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t kk = k0 + u * step;
        if (kk >= K) break;
        float wf[P][VEC];
        DCF_GEMV_UNROLL
        for (int q = 0; q < P; ++q) wv[u][q].Unpack(wf[q]);
        float nw[VEC], nb[VEC];
        if constexpr (NORM != kNoNorm) dev::LoadVec<float, VEC>(p.in.norm_weight + kk, nw);
        if constexpr (NORM == kLayerNorm) {
          if (p.in.norm_bias != nullptr) {
            dev::LoadVec<float, VEC>(p.in.norm_bias + kk, nb);
          } else {
            DCF_GEMV_UNROLL
            for (int e = 0; e < VEC; ++e) nb[e] = 0.0f;  // NormKernel's `+ 0.0f`
          }
        }
        DCF_GEMV_UNROLL
        for (int mm = 0; mm < MT; ++mm) {
          if (mm < M) {
            float xv[VEC];
            if constexpr (NORM == kRmsNorm) {
              dev::LoadVec<float, VEC>(xf + x_at[mm] + kk, xv);
              DCF_GEMV_UNROLL
              for (int e = 0; e < VEC; ++e) {
                const float n = xv[e] * inv[mm];
                xv[e] = dev::ToFloat(dev::FromFloat<T>(n * nw[e]));
              }
            } else if constexpr (NORM == kLayerNorm) {
              dev::LoadVec<float, VEC>(xf + x_at[mm] + kk, xv);
              DCF_GEMV_UNROLL
              for (int e = 0; e < VEC; ++e) {
                const float n = static_cast<float>((xv[e] - mean[mm]) * inv_sd[mm]);
                xv[e] = dev::ToFloat(dev::FromFloat<T>(fmaf(n, nw[e], nb[e])));  // as NormKernel
              }
            } else {
              dev::LoadVec<T, VEC>(x + x_at[mm] + kk, xv);
            }
            DCF_GEMV_UNROLL
            for (int q = 0; q < P; ++q) {
              DCF_GEMV_UNROLL
              for (int e = 0; e < VEC; ++e) acc[q][mm] += wf[q][e] * xv[e];
            }
          }
        }
      }
    }
  }
  // Lanes by a butterfly, then the team's warps in warp order.
  DCF_GEMV_UNROLL
  for (int q = 0; q < P; ++q) {
    DCF_GEMV_UNROLL
    for (int mm = 0; mm < MT; ++mm) {
      const float s = dev::WarpSum(acc[q][mm]);
      if (lane == 0) red[(warp * 2 + q) * kGemvMaxRows + mm] = s;
    }
  }
  __syncthreads();
  if (!live || slice != 0 || lane >= M) return;
  const int mm = lane;
  float v[P];
  DCF_GEMV_UNROLL
  for (int q = 0; q < P; ++q) {
    float s = 0.0f;
    for (int t = 0; t < team_warps; ++t) s += red[((warp + t) * 2 + q) * kGemvMaxRows + mm];
    // Quantized weights: the sum times the output channel's scale, rounded on its own
    // (gemm.h: v = S * w_scale[n], then + bias).
    if constexpr (kScaled) s = __fmul_rn(s, a.w_scale[j + q * p.features]);
    if (a.bias != nullptr) s += a.bias[j + q * p.features];
    v[q] = s;
  }
  if constexpr (P == 2) {
    const float g = v[0], u = v[1];
    const float act = g / (1.0f + expf(-g)) * u;  // LaunchActivation's kSwiGlu
    StoreAct(p.o.act, p.o.act_type, mm * p.o.act_ld + j, act);
  } else if (p.o.epilogue == GemvEpilogue::kGelu) {
    // LaunchActivation's kGelu
    StoreAct(p.o.act, p.o.act_type, mm * p.o.act_ld + j, dev::GeluErf(v[0]));
  } else {
    float* y = a.y + mm * a.ldy + j;
    *y = a.accumulate ? *y + v[0] : v[0];
  }
}

template <typename TW, int VEC, int P, int NORM>
struct ByType {
  template <typename T>
  static cudaError_t Run(const Params& p, int blocks, cudaStream_t stream) {
    const int m = p.a.m;
    if (m <= 1) {
      DCF_LAUNCH((GemvKernel<T, TW, VEC, 1, P, NORM>), blocks, kThreads, 0, stream, p);
    } else if (m <= 2) {
      DCF_LAUNCH((GemvKernel<T, TW, VEC, 2, P, NORM>), blocks, kThreads, 0, stream, p);
    } else if (m <= 4) {
      DCF_LAUNCH((GemvKernel<T, TW, VEC, 4, P, NORM>), blocks, kThreads, 0, stream, p);
    } else if (m <= 8) {
      DCF_LAUNCH((GemvKernel<T, TW, VEC, 8, P, NORM>), blocks, kThreads, 0, stream, p);
    } else {
      DCF_LAUNCH((GemvKernel<T, TW, VEC, kGemvMaxRows, P, NORM>), blocks, kThreads, 0, stream, p);
    }
    return cudaGetLastError();
  }
};

template <typename TW, int P, int NORM>
cudaError_t DispatchVec(const Params& p, bool vec, int blocks, cudaStream_t stream) {
  if (vec) return dev::DispatchElem<ByType<TW, kVecElems, P, NORM>>(p.a.dtype, p, blocks, stream);
  // Scalar loads for weights in the compute dtype only (quantized ones: not instantiated,
  // halving their compile time; GemvHandles sends unaligned ones to the library).
  if constexpr (std::is_void_v<TW>) {
    return dev::DispatchElem<ByType<TW, 1, P, NORM>>(p.a.dtype, p, blocks, stream);
  }
  return cudaErrorInvalidValue;
}
template <typename TW, int P>
cudaError_t DispatchForm(const Params& p, bool vec, int blocks, cudaStream_t stream) {
  if (p.in.norm_weight == nullptr) return DispatchVec<TW, P, kNoNorm>(p, vec, blocks, stream);
  if (!p.in.layer_norm) return DispatchVec<TW, P, kRmsNorm>(p, vec, blocks, stream);
  // LayerNorm models have no SwiGLU MLP: not instantiated (LaunchGemv refuses it).
  if constexpr (P == 1) return DispatchVec<TW, P, kLayerNorm>(p, vec, blocks, stream);
  return cudaErrorInvalidValue;
}

// Every form of the kernel for one weight storage TW (void: the compute dtype), defined in
// the .cu file of that storage.
template <typename TW>
cudaError_t DispatchWeights(const Params& p, bool vec, int blocks, cudaStream_t stream) {
  const bool glu = p.o.epilogue == GemvEpilogue::kSwiGlu;
  return glu ? DispatchForm<TW, 2>(p, vec, blocks, stream)
             : DispatchForm<TW, 1>(p, vec, blocks, stream);
}
cudaError_t DispatchDense(const Params& p, bool vec, int blocks, cudaStream_t stream);
cudaError_t DispatchInt8(const Params& p, bool vec, int blocks, cudaStream_t stream);
cudaError_t DispatchFp8(const Params& p, bool vec, int blocks, cudaStream_t stream);

}  // namespace gemv_detail
}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
