// AVX-512 helpers shared by the attention kernels (dcmha_avx512.cc: one query at a time;
// attention_tile_avx512.cc: a tile of queries), the FFN's activation (activation_avx512.cc)
// and the activations' int8 quantizer (matmul_avx512.cc). Internal to engine/cpu: include it
// only from translation units whose AVX-512 code runs after cpu_isa.h found AVX-512. Both
// attention kernels must use these very functions (the same exp, the same widening), so
// that they compute bit for bit the same values.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "engine/weights/dtype.h"

#define DCF_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define DCF_AVX512_INLINE DCF_AVX512 inline __attribute__((always_inline))

namespace dcf::cpu::kernels {

// Loads of 16 row elements of each KV dtype, widened exactly to f32 (masked lanes are 0).
template <DType D>
struct VecElem;
template <>
struct VecElem<DType::kF32> {
  using T = float;
  static DCF_AVX512_INLINE __m512 Load(const float* p) { return _mm512_loadu_ps(p); }
  static DCF_AVX512_INLINE __m512 LoadMasked(__mmask16 m, const float* p) {
    return _mm512_maskz_loadu_ps(m, p);
  }
};
template <>
struct VecElem<DType::kBF16> {
  using T = uint16_t;
  static DCF_AVX512_INLINE __m512 Widen(__m256i b) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
  }
  static DCF_AVX512_INLINE __m512 Load(const uint16_t* p) {
    return Widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static DCF_AVX512_INLINE __m512 LoadMasked(__mmask16 m, const uint16_t* p) {
    return Widen(_mm256_maskz_loadu_epi16(m, p));
  }
};
template <>
struct VecElem<DType::kF16> {
  using T = uint16_t;
  static DCF_AVX512_INLINE __m512 Load(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static DCF_AVX512_INLINE __m512 LoadMasked(__mmask16 m, const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  }
};

DCF_AVX512_INLINE __mmask16 TailMask(int n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1);
}

// out[l] = lane l of every in[i] (out[l][i] = in[i][l]): a 16 x 16 transpose, 64 shuffles.
DCF_AVX512_INLINE void Transpose16(const __m512* in, __m512* out) {
  __m512 t[16], u[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(in[2 * i], in[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(in[2 * i], in[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    u[4 * i + 0] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xee);
    u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xee);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(u[i], u[4 + i], 0x88);
    t[4 + i] = _mm512_shuffle_f32x4(u[i], u[4 + i], 0xdd);
    t[8 + i] = _mm512_shuffle_f32x4(u[8 + i], u[12 + i], 0x88);
    t[12 + i] = _mm512_shuffle_f32x4(u[8 + i], u[12 + i], 0xdd);
  }
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    out[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
    out[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xdd);
  }
}

// r[i] = ((v[i][0] + v[i][1]) + v[i][2]) + ... + v[i][15], the lanes of v[i] summed in lane
// order, for 16 vectors: Transpose16, then 15 vertical adds. The order of a head's dot
// product over its 16 lane chains in both attention kernels (a query tile keeps it with one
// running sum per dot product, adding the lane chains as they finish).
DCF_AVX512_INLINE __m512 SumLanesInOrder16(const __m512* v) {
  __m512 t[16];
  Transpose16(v, t);
  __m512 sum = t[0];
#pragma GCC unroll 16
  for (int l = 1; l < 16; ++l) sum = _mm512_add_ps(sum, t[l]);
  return sum;
}

// `p` itself, opaque to the optimiser: GCC otherwise folds a runtime offset into one index
// register per vector or broadcast element it loads (and runs out of registers) instead of
// one base pointer with constant displacements.
template <typename T>
DCF_AVX512_INLINE const T* Opaque(const T* p) {
  asm("" : "+r"(p));
  return p;
}

// exp's polynomial part: p and n with exp(x) ~ p * 2^n (Cephes expf polynomial on
// x - n ln2, |x - n ln2| <= ln2 / 2; ~1 ulp), for x in [-87.3, 88.8].
DCF_AVX512_INLINE void ExpParts(__m512 x, __m512* p_out, __m512* n_out) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  *p_out = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  *n_out = n;
}

// exp(x) for x <= 0 (scores minus their maximum), ~1 ulp; 0 below -87.3.
DCF_AVX512_INLINE __m512 ExpNonPositive(__m512 x) {
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
  __m512 p, n;
  ExpParts(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), &p, &n);
  return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~tiny), p, n);
}

// exp(x) for any x, ~1 ulp: 0 below -87.3 (expf(-87.3) is 1.2e-38, about the smallest
// normal float), +inf from 88.8 on (expf overflows from 88.73), NaN stays NaN.
DCF_AVX512_INLINE __m512 Exp(__m512 x) {
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  __m512 p, n;
  ExpParts(_mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.8f)), &p,
           &n);
  return _mm512_mask_mov_ps(_mm512_maskz_scalef_ps(static_cast<__mmask16>(~tiny), p, n), nan, x);
}

}  // namespace dcf::cpu::kernels
