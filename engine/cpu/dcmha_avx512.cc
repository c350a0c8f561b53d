// AVX-512 version of cpu::AttendOne (dcmha.h): the same two passes over the keys, with the
// heads of a key in vector lanes (16 per vector, the last chunk masked), per-head dot products
// (16 lane chains each) summed 16 at a time by a transpose and adds in lane order
// (SumLanesInOrder16), and a vector exp. Every function carries
// the target attribute; dcmha.cc calls it only when cpu_isa.h found AVX-512. Cache rows of
// 16-bit dtypes are widened as they are loaded (bf16: a 16-bit shift; f16: vcvtph2ps), so
// the arithmetic is that of f32 rows holding the same values.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12, inside its own intrinsics
#include <immintrin.h>

#include <cmath>

#include "engine/cpu/dcmha_avx512_inl.h"
#include "engine/cpu/dcmha_kernels.h"
#include "engine/model/model_config.h"

namespace dcf::cpu::kernels {
namespace {

constexpr int kRank = ModelConfig::kRank;
constexpr int kMaxHeads = 256;

// Lanes 0..3 of the result: the sums of a, b, c and d.
DCF_AVX512_INLINE __m128 Reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 t0 = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  const __m512 t1 = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
  // Per 128-bit lane: partial sums of a, b, c, d.
  __m512 u = _mm512_add_ps(_mm512_shuffle_ps(t0, t1, 0x44), _mm512_shuffle_ps(t0, t1, 0xee));
  u = _mm512_add_ps(u, _mm512_shuffle_f32x4(u, u, 0x4e));
  u = _mm512_add_ps(u, _mm512_shuffle_f32x4(u, u, 0xb1));
  return _mm512_castps512_ps128(u);
}

// Compose (dcmha.h) of s[NP] in place; q/k terms as in Compose, N entries each (masked
// loads past them); the key terms kw, kg are row elements of dtype D. kRank == 2: the four
// rank dot products are folded together.
template <DType D>
DCF_AVX512_INLINE void ComposeInPlace(int N, const float* qw, const float* qg,
                                      const typename VecElem<D>::T* kw,
                                      const typename VecElem<D>::T* kg, float* s) {
  using E = VecElem<D>;
  static_assert(kRank == 2, "the dot products are folded four at a time");
  __m512 dq0 = _mm512_setzero_ps(), dq1 = dq0, dk0 = dq0, dk1 = dq0;
  for (int c = 0; c < N; c += 16) {
    const __mmask16 m = TailMask(N - c);
    const __m512 sv = _mm512_loadu_ps(s + c);
    dq0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, qw + c), sv, dq0);
    dq1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, qw + N + c), sv, dq1);
    dk0 = _mm512_fmadd_ps(E::LoadMasked(m, kw + c), sv, dk0);
    dk1 = _mm512_fmadd_ps(E::LoadMasked(m, kw + N + c), sv, dk1);
  }
  alignas(16) float d[4];  // <W1q[0], s>, <W1q[1], s>, <W1k[0], s>, <W1k[1], s>
  _mm_store_ps(d, Reduce4(dq0, dq1, dk0, dk1));
  const float* q2 = qw + kRank * N;
  const typename E::T* k2 = kw + kRank * N;
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int c = 0; c < N; c += 16) {
    const __mmask16 m = TailMask(N - c);
    const __m512 sv = _mm512_loadu_ps(s + c);
    const __m512 g = _mm512_add_ps(_mm512_add_ps(one, _mm512_maskz_loadu_ps(m, qg + c)),
                                   E::LoadMasked(m, kg + c));
    __m512 v = _mm512_mul_ps(sv, g);
    v = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q2 + c), _mm512_set1_ps(d[0]), v);
    v = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q2 + N + c), _mm512_set1_ps(d[1]), v);
    v = _mm512_fmadd_ps(E::LoadMasked(m, k2 + c), _mm512_set1_ps(d[2]), v);
    v = _mm512_fmadd_ps(E::LoadMasked(m, k2 + N + c), _mm512_set1_ps(d[3]), v);
    _mm512_storeu_ps(s + c, _mm512_maskz_mov_ps(m, v));  // padding heads stay 0
  }
}

// s[NP] = scale * <q_n, k_n> for every head n (zero past N); k holds row elements of dtype D.
template <DType D>
DCF_AVX512_INLINE void Scores(const float* q, const typename VecElem<D>::T* k, int N, int hd,
                              float scale, float* s) {
  using E = VecElem<D>;
  const __mmask16 dtail = TailMask(hd % 16 == 0 ? 16 : hd % 16);
  const int full = hd % 16 == 0 ? hd : hd - hd % 16;
  for (int h0 = 0; h0 < N; h0 += 16) {
    __m512 acc[16];
    const int nh = N - h0 < 16 ? N - h0 : 16;
    for (int h = 0; h < 16; ++h) acc[h] = _mm512_setzero_ps();
    for (int h = 0; h < nh; ++h) {
      const float* qn = q + (h0 + h) * hd;
      const typename E::T* kn = k + (h0 + h) * hd;
      __m512 a = _mm512_setzero_ps();
      int d = 0;
      for (; d + 16 <= full; d += 16) {
        a = _mm512_fmadd_ps(_mm512_loadu_ps(qn + d), E::Load(kn + d), a);
      }
      if (d < hd) {
        a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(dtail, qn + d), E::LoadMasked(dtail, kn + d), a);
      }
      acc[h] = a;
    }
    _mm512_storeu_ps(s + h0, _mm512_mul_ps(SumLanesInOrder16(acc), _mm512_set1_ps(scale)));
  }
}

// out[n, :] = sum over the keys of P[j][n] * v_j[n, :] for heads [n0, n0 + G), each head's
// HC vectors of 16 (the last masked) held in registers across all keys: the value rows are
// read once per head group, and `out` is written once.
template <DType D, int HC>
DCF_AVX512 void AccumulateHeadGroup(const KvRowLayout& layout, const KeySegment* segments,
                                    int num_segments, int64_t lo, int64_t hi, const float* P,
                                    int NP, int n0, int G, float* out) {
  using E = VecElem<D>;
  constexpr int kMaxG = 16 / HC;
  const int hd = layout.head_dim;
  const __mmask16 dtail = TailMask(hd - (HC - 1) * 16);
  __m512 acc[kMaxG][HC];
#pragma GCC unroll 16
  for (int h = 0; h < kMaxG; ++h) {
#pragma GCC unroll 8
    for (int c = 0; c < HC; ++c) acc[h][c] = _mm512_setzero_ps();
  }
  for (int si = 0; si < num_segments; ++si) {
    const KeySegment& seg = segments[si];
    const int64_t begin = lo > seg.pos0 ? lo : seg.pos0;
    const int64_t end = hi + 1 < seg.pos0 + seg.count ? hi + 1 : seg.pos0 + seg.count;
    for (int64_t p = begin; p < end; ++p) {
      const typename E::T* v = static_cast<const typename E::T*>(seg.rows) +
                               (p - seg.pos0) * seg.stride + layout.v_offset() + n0 * hd;
      const float* pj = P + (p - lo) * NP + n0;
#pragma GCC unroll 16
      for (int h = 0; h < kMaxG; ++h) {
        if (h >= G) break;
        const __m512 w = _mm512_set1_ps(pj[h]);
#pragma GCC unroll 8
        for (int c = 0; c < HC; ++c) {
          const __m512 vv = c == HC - 1 ? E::LoadMasked(dtail, v + h * hd + c * 16)
                                        : E::Load(v + h * hd + c * 16);
          acc[h][c] = _mm512_fmadd_ps(w, vv, acc[h][c]);
        }
      }
    }
  }
#pragma GCC unroll 16
  for (int h = 0; h < kMaxG; ++h) {
    if (h >= G) break;
#pragma GCC unroll 8
    for (int c = 0; c < HC; ++c) {
      if (c == HC - 1) {
        _mm512_mask_storeu_ps(out + (n0 + h) * hd + c * 16, dtail, acc[h][c]);
      } else {
        _mm512_storeu_ps(out + (n0 + h) * hd + c * 16, acc[h][c]);
      }
    }
  }
}

template <DType D, int HC>
DCF_AVX512 void AccumulateValues(const KvRowLayout& layout, const KeySegment* segments,
                                 int num_segments, int64_t lo, int64_t hi, const float* P,
                                 int NP, float* out) {
  constexpr int kMaxG = 16 / HC;
  for (int n0 = 0; n0 < layout.n_head; n0 += kMaxG) {
    const int G = layout.n_head - n0 < kMaxG ? layout.n_head - n0 : kMaxG;
    AccumulateHeadGroup<D, HC>(layout, segments, num_segments, lo, hi, P, NP, n0, G, out);
  }
}

template <DType D>
DCF_AVX512 void AttendOneAvx512Impl(const KvRowLayout& layout, const QueryInputs& qi,
                                    const KeySegment* segments, int num_segments, int64_t lo,
                                    int64_t hi, float* scratch, float* out) {
  using T = typename VecElem<D>::T;
  const int N = layout.n_head, hd = layout.head_dim;
  const int NP = (N + 15) / 16 * 16;  // a key's scores, padded to whole vectors
  const int64_t L = hi - lo + 1;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  float* S = scratch;  // [L, NP]

  // Pass 1: scores and pre-compose at every key.
  for (int si = 0; si < num_segments; ++si) {
    const KeySegment& seg = segments[si];
    const int64_t begin = lo > seg.pos0 ? lo : seg.pos0;
    const int64_t end = hi + 1 < seg.pos0 + seg.count ? hi + 1 : seg.pos0 + seg.count;
    for (int64_t p = begin; p < end; ++p) {
      const T* row = static_cast<const T*>(seg.rows) + (p - seg.pos0) * seg.stride;
      float* s = S + (p - lo) * NP;
      Scores<D>(qi.q, row + layout.k_offset(), N, hd, scale, s);
      const T* kt = row + layout.branch_offset(0);
      if (qi.compose) ComposeInPlace<D>(N, qi.pre_w, qi.pre_g, kt, kt + 2 * kRank * N, s);
    }
  }

  // Softmax over keys, per head (heads in lanes).
  alignas(64) float inv[kMaxHeads];
  for (int c = 0; c < NP; c += 16) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < L; ++j) mx = _mm512_max_ps(mx, _mm512_loadu_ps(S + j * NP + c));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t j = 0; j < L; ++j) {
      const __m512 e = ExpNonPositive(_mm512_sub_ps(_mm512_loadu_ps(S + j * NP + c), mx));
      _mm512_storeu_ps(S + j * NP + c, e);
      sum = _mm512_add_ps(sum, e);
    }
    _mm512_store_ps(inv + c, _mm512_div_ps(_mm512_set1_ps(1.0f), sum));
  }

  // Pass 2: normalise and post-compose every key's probabilities, then accumulate values.
  for (int si = 0; si < num_segments; ++si) {
    const KeySegment& seg = segments[si];
    const int64_t begin = lo > seg.pos0 ? lo : seg.pos0;
    const int64_t end = hi + 1 < seg.pos0 + seg.count ? hi + 1 : seg.pos0 + seg.count;
    for (int64_t p = begin; p < end; ++p) {
      float* s = S + (p - lo) * NP;
      for (int c = 0; c < NP; c += 16) {
        _mm512_storeu_ps(s + c, _mm512_mul_ps(_mm512_loadu_ps(s + c), _mm512_load_ps(inv + c)));
      }
      if (qi.compose) {
        const T* kt =
            static_cast<const T*>(seg.rows) + (p - seg.pos0) * seg.stride + layout.branch_offset(1);
        ComposeInPlace<D>(N, qi.post_w, qi.post_g, kt, kt + 2 * kRank * N, s);
      }
    }
  }
  switch ((hd + 15) / 16) {
    case 1: AccumulateValues<D, 1>(layout, segments, num_segments, lo, hi, S, NP, out); break;
    case 2: AccumulateValues<D, 2>(layout, segments, num_segments, lo, hi, S, NP, out); break;
    case 3: AccumulateValues<D, 3>(layout, segments, num_segments, lo, hi, S, NP, out); break;
    case 4: AccumulateValues<D, 4>(layout, segments, num_segments, lo, hi, S, NP, out); break;
    case 5: AccumulateValues<D, 5>(layout, segments, num_segments, lo, hi, S, NP, out); break;
    case 6: AccumulateValues<D, 6>(layout, segments, num_segments, lo, hi, S, NP, out); break;
    case 7: AccumulateValues<D, 7>(layout, segments, num_segments, lo, hi, S, NP, out); break;
    default: AccumulateValues<D, 8>(layout, segments, num_segments, lo, hi, S, NP, out); break;
  }
}

}  // namespace

bool AttendOneAvx512Supports(const KvRowLayout& layout) {
  return layout.head_dim <= 128;
}

void AttendOneAvx512(const KvRowLayout& layout, const QueryInputs& qi, const KeySegment* segments,
                     int num_segments, int64_t lo, int64_t hi, DType dtype, float* scratch,
                     float* out) {
  switch (dtype) {
    case DType::kF32:
      return AttendOneAvx512Impl<DType::kF32>(layout, qi, segments, num_segments, lo, hi,
                                              scratch, out);
    case DType::kBF16:
      return AttendOneAvx512Impl<DType::kBF16>(layout, qi, segments, num_segments, lo, hi,
                                               scratch, out);
    case DType::kF16:
      return AttendOneAvx512Impl<DType::kF16>(layout, qi, segments, num_segments, lo, hi,
                                              scratch, out);
  }
}

}  // namespace dcf::cpu::kernels
