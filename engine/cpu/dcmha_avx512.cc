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
#include <cstdint>
#include <cstring>

#include "engine/cpu/dcmha_avx512_inl.h"
#include "engine/cpu/dcmha_kernels.h"
#include "engine/cpu/team.h"
#include "engine/model/model_config.h"

namespace dcf::cpu::kernels {
namespace {

constexpr int kRank = ModelConfig::kRank;
constexpr int kLanes = 16;

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

// s[r][0, NP) = scale * <q_n, k_n> for every head n of NK keys (1 or 2), zero past N; key r's
// K part at k[r], row elements of dtype D, HC = ceil(hd / 16) vectors a head (the last one
// masked). The dot products go 16 at a time through SumLanesInOrder16: 16 heads of one key,
// or 8 heads of each of two keys, which then share every load of q.
template <DType D, int HC, int NK>
DCF_AVX512_INLINE void ScoresKeys(const float* q, const typename VecElem<D>::T* const* k, int N,
                                  int hd, float scale, float* const* s) {
  using E = VecElem<D>;
  using T = typename E::T;
  constexpr int kH = kLanes / NK;  // heads of each key in a call
  const bool tail = hd % 16 != 0;
  const __mmask16 dtail = TailMask(hd - (HC - 1) * 16);
  const __m512 sv = _mm512_set1_ps(scale);
  for (int h0 = 0; h0 < N; h0 += kH) {
    __m512 acc[kLanes];
#pragma GCC unroll 16
    for (int i = 0; i < kLanes; ++i) acc[i] = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int h = 0; h < kH; ++h) {
      if (h0 + h >= N) break;
      const float* qh = Opaque(q + (h0 + h) * hd);
      const T* kh[NK];
#pragma GCC unroll 2
      for (int r = 0; r < NK; ++r) kh[r] = Opaque(k[r] + (h0 + h) * hd);
#pragma GCC unroll 8
      for (int c = 0; c < HC; ++c) {
        const bool masked = c == HC - 1 && tail;
        const __m512 qv =
            masked ? _mm512_maskz_loadu_ps(dtail, qh + 16 * c) : _mm512_loadu_ps(qh + 16 * c);
#pragma GCC unroll 2
        for (int r = 0; r < NK; ++r) {
          const __m512 kv = masked ? E::LoadMasked(dtail, kh[r] + 16 * c) : E::Load(kh[r] + 16 * c);
          acc[r * kH + h] = _mm512_fmadd_ps(qv, kv, acc[r * kH + h]);
        }
      }
    }
    const __m512 v = _mm512_mul_ps(SumLanesInOrder16(acc), sv);
    if constexpr (NK == 1) {
      _mm512_storeu_ps(s[0] + h0, v);
    } else {
      _mm256_storeu_ps(s[0] + h0, _mm512_castps512_ps256(v));
      _mm256_storeu_ps(s[1] + h0, _mm512_extractf32x8_ps(v, 1));
    }
  }
  if constexpr (NK == 2) {
    // Heads past N up to the padded width: 0, as a 16-head call leaves them.
    const int written = (N + kH - 1) / kH * kH, NP = (N + 15) / 16 * 16;
    if (written < NP) {
      for (int r = 0; r < NK; ++r) _mm256_storeu_ps(s[r] + written, _mm256_setzero_ps());
    }
  }
}

// Prefetches the cache lines of [p, p + bytes) into L1 (rows of keys a few keys ahead: a
// decode query reads each row once, so its time goes to waiting for memory unless the next
// rows are on their way while this one is computed).
DCF_AVX512_INLINE void PrefetchBytes(const void* p, int bytes) {
  const char* c = static_cast<const char*>(p);
  const char* end = c + bytes;
  for (c = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(c) & ~uintptr_t{63}); c < end;
       c += 64) {
    _mm_prefetch(c, _MM_HINT_T0);
  }
}

// Keys whose rows are prefetched ahead of the one being computed.
constexpr int kAhead = 4;

// Each visible key's row (row elements of type T), kept in the float scratch after the scores:
// two floats a pointer, written and read by memcpy (no aliasing of the floats).
template <typename T>
class RowTable {
 public:
  explicit RowTable(float* storage) : storage_(storage) {}
  void Set(int64_t j, const T* row) { std::memcpy(storage_ + 2 * j, &row, sizeof row); }
  const T* operator[](int64_t j) const {
    const T* row;
    std::memcpy(&row, storage_ + 2 * j, sizeof row);
    return row;
  }

 private:
  static_assert(sizeof(const T*) <= 2 * sizeof(float), "a row pointer takes two floats");
  float* storage_;
};

// out[n, :] = sum over the keys of P[j][n] * v_j[n, :] for heads [n0, n0 + G), each head's
// HC vectors of 16 (the last masked) held in registers across all keys: the value rows are
// read once per head group, and `out` is written once. Key j's row at rows[j].
template <DType D, int HC>
DCF_AVX512 void AccumulateHeadGroup(const KvRowLayout& layout,
                                    const RowTable<typename VecElem<D>::T>& rows, int64_t L,
                                    const float* P, int NP, int n0, int G, float* out) {
  using E = VecElem<D>;
  using T = typename E::T;
  constexpr int kMaxG = 16 / HC;
  const int hd = layout.head_dim;
  const int off = layout.v_offset() + n0 * hd;
  const int bytes = G * hd * static_cast<int>(sizeof(T));
  const __mmask16 dtail = TailMask(hd - (HC - 1) * 16);
  __m512 acc[kMaxG][HC];
#pragma GCC unroll 16
  for (int h = 0; h < kMaxG; ++h) {
#pragma GCC unroll 8
    for (int c = 0; c < HC; ++c) acc[h][c] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < L; ++j) {
    if (j + kAhead < L) PrefetchBytes(rows[j + kAhead] + off, bytes);
    const float* pj = P + j * NP + n0;
#pragma GCC unroll 16
    for (int h = 0; h < kMaxG; ++h) {
      if (h >= G) break;
      const T* v = Opaque(rows[j] + off + h * hd);
      const __m512 w = _mm512_set1_ps(pj[h]);
#pragma GCC unroll 8
      for (int c = 0; c < HC; ++c) {
        const __m512 vv = c == HC - 1 ? E::LoadMasked(dtail, v + c * 16) : E::Load(v + c * 16);
        acc[h][c] = _mm512_fmadd_ps(w, vv, acc[h][c]);
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

// One query over its keys; with a team of more than one thread (every one of which calls it
// with the same arguments and the same shared `scratch`), split between them: the keys of
// both passes in consecutive runs (pass 1 in whole pairs), the softmax on the leader, the
// value sums by head group. Every key, head and head group goes through the same operations
// in the same order whoever runs it: the bits of one thread. Returns after a barrier.
template <DType D, int HC>
DCF_AVX512 void AttendOneAvx512Impl(const KvRowLayout& layout, const QueryInputs& qi,
                                    const KeySegment* segments, int num_segments, int64_t lo,
                                    int64_t hi, float* scratch, float* out, Team& team) {
  using T = typename VecElem<D>::T;
  const int N = layout.n_head, hd = layout.head_dim;
  const int NP = (N + 15) / 16 * 16;  // a key's scores, padded to whole vectors
  const int64_t L = hi - lo + 1;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  float* S = scratch;                                        // [L, NP]
  RowTable<T> rows(S + L * NP);                              // [L] each key's row
  float* inv = S + L * (NP + 2);                             // [NP] 1 / softmax sums
  if (team.leader()) {
    int64_t j = 0;
    for (int si = 0; si < num_segments; ++si) {
      const KeySegment& seg = segments[si];
      const int64_t begin = lo > seg.pos0 ? lo : seg.pos0;
      const int64_t end = hi + 1 < seg.pos0 + seg.count ? hi + 1 : seg.pos0 + seg.count;
      for (int64_t p = begin; p < end; ++p) {
        rows.Set(j++, static_cast<const T*>(seg.rows) + (p - seg.pos0) * seg.stride);
      }
    }
  }
  team.Barrier();
  const int kbytes = N * hd * static_cast<int>(sizeof(T));
  const int tbytes = layout.BranchFloats() * static_cast<int>(sizeof(T));

  // Pass 1: scores (two keys at a time) and pre-compose at every key; a thread's keys are
  // whole pairs, the last thread's also the odd last key.
  int64_t pair0, pair1;
  team.Share(L / 2, &pair0, &pair1);
  const int64_t j_end = team.rank() == team.size() - 1 ? L : 2 * pair1;
  int64_t j = 2 * pair0;
  for (; j + 2 <= j_end; j += 2) {
    for (int64_t a = j + kAhead; a < j + kAhead + 2 && a < j_end; ++a) {
      PrefetchBytes(rows[a] + layout.k_offset(), kbytes);
      PrefetchBytes(rows[a] + layout.branch_offset(0), tbytes);
    }
    const T* k[2] = {rows[j] + layout.k_offset(), rows[j + 1] + layout.k_offset()};
    float* ss[2] = {S + j * NP, S + (j + 1) * NP};
    ScoresKeys<D, HC, 2>(qi.q, k, N, hd, scale, ss);
    if (qi.compose) {
      for (int r = 0; r < 2; ++r) {
        const T* kt = rows[j + r] + layout.branch_offset(0);
        ComposeInPlace<D>(N, qi.pre_w, qi.pre_g, kt, kt + 2 * kRank * N, ss[r]);
      }
    }
  }
  if (j < j_end) {
    const T* k = rows[j] + layout.k_offset();
    float* s = S + j * NP;
    ScoresKeys<D, HC, 1>(qi.q, &k, N, hd, scale, &s);
    const T* kt = rows[j] + layout.branch_offset(0);
    if (qi.compose) ComposeInPlace<D>(N, qi.pre_w, qi.pre_g, kt, kt + 2 * kRank * N, s);
  }
  team.Barrier();

  // Softmax over keys, per head (heads in lanes): the leader (its sums run over the keys in
  // order).
  if (team.leader()) {
    for (int c = 0; c < NP; c += 16) {
      __m512 mx = _mm512_set1_ps(-INFINITY);
      for (int64_t i = 0; i < L; ++i) mx = _mm512_max_ps(mx, _mm512_loadu_ps(S + i * NP + c));
      __m512 sum = _mm512_setzero_ps();
      for (int64_t i = 0; i < L; ++i) {
        const __m512 e = ExpNonPositive(_mm512_sub_ps(_mm512_loadu_ps(S + i * NP + c), mx));
        _mm512_storeu_ps(S + i * NP + c, e);
        sum = _mm512_add_ps(sum, e);
      }
      _mm512_storeu_ps(inv + c, _mm512_div_ps(_mm512_set1_ps(1.0f), sum));
    }
  }
  team.Barrier();

  // Pass 2: normalise and post-compose every key's probabilities, then accumulate values.
  int64_t i0, i1;
  team.Share(L, &i0, &i1);
  for (int64_t i = i0; i < i1; ++i) {
    float* s = S + i * NP;
    for (int c = 0; c < NP; c += 16) {
      _mm512_storeu_ps(s + c, _mm512_mul_ps(_mm512_loadu_ps(s + c), _mm512_loadu_ps(inv + c)));
    }
    if (qi.compose) {
      if (i + kAhead < i1) PrefetchBytes(rows[i + kAhead] + layout.branch_offset(1), tbytes);
      const T* kt = rows[i] + layout.branch_offset(1);
      ComposeInPlace<D>(N, qi.post_w, qi.post_g, kt, kt + 2 * kRank * N, s);
    }
  }
  team.Barrier();
  constexpr int kMaxG = 16 / HC;
  const int groups = (N + kMaxG - 1) / kMaxG;
  int64_t g0, g1;
  team.Share(groups, &g0, &g1);
  for (int64_t g = g0; g < g1; ++g) {
    const int n0 = static_cast<int>(g) * kMaxG;
    const int G = N - n0 < kMaxG ? N - n0 : kMaxG;
    AccumulateHeadGroup<D, HC>(layout, rows, L, S, NP, n0, G, out);
  }
  team.Barrier();
}

// AttendOneAvx512Impl with HC = ceil(head_dim / 16), 1..8, as a compile-time constant.
template <DType D, int HC = 1>
void AttendOneAnyHd(const KvRowLayout& layout, const QueryInputs& qi, const KeySegment* segments,
                    int num_segments, int64_t lo, int64_t hi, float* scratch, float* out,
                    Team& team) {
  if constexpr (HC < 8) {
    if ((layout.head_dim + 15) / 16 > HC) {
      return AttendOneAnyHd<D, HC + 1>(layout, qi, segments, num_segments, lo, hi, scratch, out,
                                       team);
    }
  }
  AttendOneAvx512Impl<D, HC>(layout, qi, segments, num_segments, lo, hi, scratch, out, team);
}

}  // namespace

bool AttendOneAvx512Supports(const KvRowLayout& layout) {
  return layout.head_dim <= 128;
}

void AttendOneAvx512(const KvRowLayout& layout, const QueryInputs& qi, const KeySegment* segments,
                     int num_segments, int64_t lo, int64_t hi, DType dtype, float* scratch,
                     float* out, Team& team) {
  switch (dtype) {
    case DType::kF32:
      return AttendOneAnyHd<DType::kF32>(layout, qi, segments, num_segments, lo, hi, scratch, out,
                                         team);
    case DType::kBF16:
      return AttendOneAnyHd<DType::kBF16>(layout, qi, segments, num_segments, lo, hi, scratch,
                                          out, team);
    case DType::kF16:
      return AttendOneAnyHd<DType::kF16>(layout, qi, segments, num_segments, lo, hi, scratch, out,
                                         team);
    case DType::kI8:  // a weight dtype only: no KV cache holds int8 rows
      break;
  }
}

}  // namespace dcf::cpu::kernels
