// AVX-512 version of cpu::AttendOne (dcmha.h): the same two passes over the keys, with the
// heads of a key in vector lanes (16 per vector, the last chunk masked), per-head dot products
// folded 16 at a time by a transpose-and-add tree, and a vector exp. Every function carries
// the target attribute; dcmha.cc calls it only when cpu_isa.h found AVX-512.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12, inside its own intrinsics
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "engine/cpu/dcmha_kernels.h"
#include "engine/model/model_config.h"

#define DCF_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define DCF_AVX512_INLINE DCF_AVX512 inline __attribute__((always_inline))

namespace dcf::cpu::kernels {
namespace {

constexpr int kRank = ModelConfig::kRank;
constexpr int kMaxHeads = 256;

DCF_AVX512_INLINE __mmask16 TailMask(int n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1);
}

// r[i] = sum of the lanes of v[i], for 16 vectors (a transpose-and-add tree: 15 adds and 30
// shuffles instead of 16 separate horizontal sums).
DCF_AVX512_INLINE __m512 Reduce16(const __m512* v) {
  __m512 t[8];
  for (int i = 0; i < 8; ++i) {
    // Per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] for a = v[2i], b = v[2i+1].
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  }
  __m512 u[4];
  for (int i = 0; i < 4; ++i) {
    // Per 128-bit lane: partial sums of v[4i..4i+3] in lanes 0..3.
    u[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0x44),
                         _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], 0xee));
  }
  // Add the four 128-bit lanes of each u and lay the results out in order.
  const __m512 w0 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88),
                                  _mm512_shuffle_f32x4(u[0], u[1], 0xdd));
  const __m512 w1 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88),
                                  _mm512_shuffle_f32x4(u[2], u[3], 0xdd));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w0, w1, 0x88), _mm512_shuffle_f32x4(w0, w1, 0xdd));
}

// exp(x) for x <= 0 (scores minus their maximum), ~1 ulp (Cephes expf polynomial on
// x - n ln2 with |x - n ln2| <= ln2 / 2, then scaled by 2^n); 0 below -87.3.
DCF_AVX512_INLINE __m512 ExpNonPositive(__m512 x) {
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
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
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~tiny), p, n);
}

// <a[N], s[NP]> where a has exactly N entries (masked loads past them).
DCF_AVX512_INLINE float Dot(const float* a, const float* s, int N) {
  __m512 acc = _mm512_setzero_ps();
  for (int c = 0; c < N; c += 16) {
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(TailMask(N - c), a + c), _mm512_loadu_ps(s + c),
                          acc);
  }
  return _mm512_reduce_add_ps(acc);
}

// Compose (dcmha.h) of s[NP] in place; q/k terms as in Compose, N entries each.
DCF_AVX512_INLINE void ComposeInPlace(int N, const float* qw, const float* qg, const float* kw,
                                      const float* kg, float* s) {
  float qa[kRank], ka[kRank];
  for (int i = 0; i < kRank; ++i) {
    qa[i] = Dot(qw + i * N, s, N);
    ka[i] = Dot(kw + i * N, s, N);
  }
  const float* q2 = qw + kRank * N;
  const float* k2 = kw + kRank * N;
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int c = 0; c < N; c += 16) {
    const __mmask16 m = TailMask(N - c);
    const __m512 sv = _mm512_loadu_ps(s + c);
    const __m512 g = _mm512_add_ps(_mm512_add_ps(one, _mm512_maskz_loadu_ps(m, qg + c)),
                                   _mm512_maskz_loadu_ps(m, kg + c));
    __m512 v = _mm512_mul_ps(sv, g);
    for (int i = 0; i < kRank; ++i) {
      v = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q2 + i * N + c), _mm512_set1_ps(qa[i]), v);
      v = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, k2 + i * N + c), _mm512_set1_ps(ka[i]), v);
    }
    _mm512_storeu_ps(s + c, _mm512_maskz_mov_ps(m, v));  // padding heads stay 0
  }
}

// s[NP] = scale * <q_n, k_n> for every head n (zero past N).
DCF_AVX512_INLINE void Scores(const float* q, const float* k, int N, int hd, float scale,
                              float* s) {
  const __mmask16 dtail = TailMask(hd % 16 == 0 ? 16 : hd % 16);
  const int full = hd % 16 == 0 ? hd : hd - hd % 16;
  for (int h0 = 0; h0 < N; h0 += 16) {
    __m512 acc[16];
    const int nh = N - h0 < 16 ? N - h0 : 16;
    for (int h = 0; h < 16; ++h) acc[h] = _mm512_setzero_ps();
    for (int h = 0; h < nh; ++h) {
      const float* qn = q + (h0 + h) * hd;
      const float* kn = k + (h0 + h) * hd;
      __m512 a = _mm512_setzero_ps();
      int d = 0;
      for (; d + 16 <= full; d += 16) {
        a = _mm512_fmadd_ps(_mm512_loadu_ps(qn + d), _mm512_loadu_ps(kn + d), a);
      }
      if (d < hd) {
        a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(dtail, qn + d), _mm512_maskz_loadu_ps(dtail, kn + d),
                            a);
      }
      acc[h] = a;
    }
    _mm512_storeu_ps(s + h0, _mm512_mul_ps(Reduce16(acc), _mm512_set1_ps(scale)));
  }
}

// out[N, hd] += p[n] * v[N, hd]
DCF_AVX512_INLINE void AccumulateValues(const float* p, const float* v, int N, int hd,
                                        float* out) {
  const __mmask16 dtail = TailMask(hd % 16 == 0 ? 16 : hd % 16);
  const int full = hd % 16 == 0 ? hd : hd - hd % 16;
  for (int n = 0; n < N; ++n) {
    const __m512 w = _mm512_set1_ps(p[n]);
    const float* vn = v + n * hd;
    float* on = out + n * hd;
    int d = 0;
    for (; d + 16 <= full; d += 16) {
      _mm512_storeu_ps(on + d, _mm512_fmadd_ps(w, _mm512_loadu_ps(vn + d), _mm512_loadu_ps(on + d)));
    }
    if (d < hd) {
      _mm512_mask_storeu_ps(on + d, dtail,
                            _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(dtail, vn + d),
                                            _mm512_maskz_loadu_ps(dtail, on + d)));
    }
  }
}

}  // namespace

DCF_AVX512 void AttendOneAvx512(const KvRowLayout& layout, const QueryInputs& qi,
                                const KeySegment* segments, int num_segments, int64_t lo,
                                int64_t hi, float* scratch, float* out) {
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
      const float* row = seg.rows + (p - seg.pos0) * seg.stride;
      float* s = S + (p - lo) * NP;
      Scores(qi.q, row + layout.k_offset(), N, hd, scale, s);
      const float* kt = row + layout.branch_offset(0);
      if (qi.compose) ComposeInPlace(N, qi.pre_w, qi.pre_g, kt, kt + 2 * kRank * N, s);
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

  // Pass 2: normalise, post-compose and accumulate values.
  std::memset(out, 0, sizeof(float) * N * hd);
  for (int si = 0; si < num_segments; ++si) {
    const KeySegment& seg = segments[si];
    const int64_t begin = lo > seg.pos0 ? lo : seg.pos0;
    const int64_t end = hi + 1 < seg.pos0 + seg.count ? hi + 1 : seg.pos0 + seg.count;
    for (int64_t p = begin; p < end; ++p) {
      const float* row = seg.rows + (p - seg.pos0) * seg.stride;
      float* s = S + (p - lo) * NP;
      for (int c = 0; c < NP; c += 16) {
        _mm512_storeu_ps(s + c, _mm512_mul_ps(_mm512_loadu_ps(s + c), _mm512_load_ps(inv + c)));
      }
      const float* kt = row + layout.branch_offset(1);
      if (qi.compose) ComposeInPlace(N, qi.post_w, qi.post_g, kt, kt + 2 * kRank * N, s);
      AccumulateValues(s, row + layout.v_offset(), N, hd, out);
    }
  }
}

}  // namespace dcf::cpu::kernels
