// AVX-512 version of cpu::AttendTile (dcmha.h): up to 16 consecutive queries of one sequence
// attend at once, one query per vector lane, so every key row read from the cache serves the
// whole tile and the loops are GEMM-shaped (a vector of 16 queries' values times a broadcast
// key element, accumulated):
//   1. per key: scores S[key][head][query] = Q^T tile x broadcast K elements, pre-compose,
//      running max;
//   2. per key: exp(S - max) and the running sum, per head and query;
//   3. per block of keys: normalise, post-compose, then PV = P x broadcast V elements into
//      the output tile [head][dim][query].
// Bit-identical to AttendOneAvx512 (dcmha_avx512.cc) for each query: every reduction of that
// kernel is reproduced per lane in its own order. A head's dot product there sums 16 lanes
// (lane l: the FMA chain over dims l, l + 16, ...) by the Reduce16 tree; here lane l's chain
// is its own vector (queries in lanes) and the same tree is written as vertical adds (Tree16).
// The compose dot products over heads likewise (Reduce4's tree: Tree4). Softmax max and sum
// and the PV accumulation run over keys in position order per query, masked to the keys the
// query sees (a masked lane keeps its value: no 0 * v terms). Lanes past a kernel's data (dims
// past hd, heads past N) add +0, as the masked loads there do. exp, the widening of 16-bit
// rows and every elementwise operation are the very ones of dcmha_avx512_inl.h.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12, inside its own intrinsics
#include <immintrin.h>

#include <algorithm>
#include <climits>
#include <cmath>

#include "engine/cpu/dcmha_avx512_inl.h"
#include "engine/cpu/dcmha_kernels.h"
#include "engine/kv/kv_cache_manager.h"
#include "engine/model/model_config.h"

namespace dcf::cpu::kernels {
namespace {

constexpr int kRank = ModelConfig::kRank;
constexpr int kC = ModelConfig::kComposeBranches;
constexpr int kLanes = QueryTile::kMaxQueries;  // 16
constexpr int kKeyBlock = 64;                   // keys whose rows are widened / reused at once

int64_t Up16(int64_t n) { return (n + 15) / 16 * 16; }

// Reduce16's tree (dcmha_avx512.cc) of the lanes p[0..16) of one dot product, per vector
// lane, is ((B0 + B1) + (B2 + B3)) with B_b = (p[4b] + p[4b+2]) + (p[4b+1] + p[4b+3])
// (ScoresTile folds it as it goes). Reduce4's tree is ((B0 + B2) + (B1 + B3)):
DCF_AVX512_INLINE __m512 Tree4(const __m512* p) {
  __m512 b[4];
  for (int i = 0; i < 4; ++i) {
    b[i] = _mm512_add_ps(_mm512_add_ps(p[4 * i], p[4 * i + 2]),
                         _mm512_add_ps(p[4 * i + 1], p[4 * i + 3]));
  }
  return _mm512_add_ps(_mm512_add_ps(b[0], b[2]), _mm512_add_ps(b[1], b[3]));
}

// The tile's query-side data, transposed to one vector per value (lanes = queries).
struct TileData {
  int N = 0, hd = 0;
  __m512i lo, hi;          // visible keys [lo, hi] per lane; empty for lanes past count
  const float* qt;         // [N][hd][16]
  const float* terms[2];   // pre, post: [4N][16] W1 | W2, then [N][16] 1 + G
};

// S[n] = scale * <q_n, k_n> for the 16 queries, n < N; k: one key's K [N][hd] (f32).
// Lane l of AttendOneAvx512's accumulator is the chain over dims l, l + 16, ...: here p[l].
// Lane l of one head's dot products for NK keys: the FMA chain over dims l, l + 16, ...;
// k[r] + koff is key r's head.
template <int NK>
DCF_AVX512_INLINE void LaneChain(const float* qt, const float* const* k, int koff, int hd,
                                 int hd16, int l, __m512* a) {
  const __m512 zero = _mm512_setzero_ps();
  for (int r = 0; r < NK; ++r) a[r] = zero;
  for (int d = l; d < hd16; d += 16) {
    if (d < hd) {
      const __m512 qv = _mm512_loadu_ps(qt + d * kLanes);
      for (int r = 0; r < NK; ++r) a[r] = _mm512_fmadd_ps(qv, _mm512_set1_ps(k[r][koff + d]), a[r]);
    } else {
      for (int r = 0; r < NK; ++r) a[r] = _mm512_add_ps(a[r], zero);  // fma(0, 0, a)
    }
  }
}

template <int NK>
DCF_AVX512_INLINE void ScoresTile(const TileData& td, const float* const* k, float scale,
                                  float* const* S) {
  const int N = td.N, hd = td.hd;
  const int hd16 = static_cast<int>(Up16(hd));
  for (int n = 0; n < N; ++n) {
    const float* qt = td.qt + static_cast<int64_t>(n) * hd * kLanes;
    // Tree16, folded as the lanes are computed (fewer live registers).
    __m512 b01[NK], b23[NK];
    for (int i = 0; i < 4; ++i) {
      __m512 x[NK], y[NK], t[NK];
      LaneChain<NK>(qt, k, n * hd, hd, hd16, 4 * i, x);
      LaneChain<NK>(qt, k, n * hd, hd, hd16, 4 * i + 2, t);
      for (int r = 0; r < NK; ++r) x[r] = _mm512_add_ps(x[r], t[r]);
      LaneChain<NK>(qt, k, n * hd, hd, hd16, 4 * i + 1, y);
      LaneChain<NK>(qt, k, n * hd, hd, hd16, 4 * i + 3, t);
      for (int r = 0; r < NK; ++r) {
        const __m512 b = _mm512_add_ps(x[r], _mm512_add_ps(y[r], t[r]));
        if (i == 0) b01[r] = b;
        if (i == 1) b01[r] = _mm512_add_ps(b01[r], b);
        if (i == 2) b23[r] = b;
        if (i == 3) b23[r] = _mm512_add_ps(b23[r], b);
      }
    }
    const __m512 sv = _mm512_set1_ps(scale);
    for (int r = 0; r < NK; ++r) {
      _mm512_storeu_ps(S[r] + n * kLanes, _mm512_mul_ps(_mm512_add_ps(b01[r], b23[r]), sv));
    }
  }
}

// ComposeInPlace (dcmha_avx512.cc) of one key's s [N][16] for the 16 queries: query terms
// `qt` (TileData::terms), key terms kw = W1 [I][N] | W2 [I][N], kg = G [N] (f32).
DCF_AVX512_INLINE void ComposeTile(int N, const float* qt, const float* kw, const float* kg,
                                   float* s) {
  static_assert(kRank == 2, "four dot products, as ComposeInPlace folds them");
  const __m512 zero = _mm512_setzero_ps();
  // d[0], d[1]: <W1q[i], s>; d[2], d[3]: <W1k[i], s>; lane l of ComposeInPlace's
  // accumulators is the chain over heads l, l + 16, ...
  __m512 d[4];
  for (int which = 0; which < 4; ++which) {
    __m512 p[16];
    for (int l = 0; l < 16; ++l) {
      __m512 a = zero;
      for (int m = l; m < Up16(N); m += 16) {
        if (m < N) {
          const __m512 sv = _mm512_loadu_ps(s + m * kLanes);
          if (which < 2) {
            a = _mm512_fmadd_ps(_mm512_loadu_ps(qt + (which * N + m) * kLanes), sv, a);
          } else {
            a = _mm512_fmadd_ps(_mm512_set1_ps(kw[(which - 2) * N + m]), sv, a);
          }
        } else {
          a = _mm512_add_ps(a, zero);
        }
      }
      p[l] = a;
    }
    d[which] = Tree4(p);
  }
  const float* q2 = qt + 2 * N * kLanes;
  const float* g1 = qt + 4 * N * kLanes;  // 1 + G
  const float* k2 = kw + 2 * N;
  for (int m = 0; m < N; ++m) {
    const __m512 g = _mm512_add_ps(_mm512_loadu_ps(g1 + m * kLanes), _mm512_set1_ps(kg[m]));
    __m512 v = _mm512_mul_ps(_mm512_loadu_ps(s + m * kLanes), g);
    v = _mm512_fmadd_ps(_mm512_loadu_ps(q2 + m * kLanes), d[0], v);
    v = _mm512_fmadd_ps(_mm512_loadu_ps(q2 + (N + m) * kLanes), d[1], v);
    v = _mm512_fmadd_ps(_mm512_set1_ps(k2[m]), d[2], v);
    v = _mm512_fmadd_ps(_mm512_set1_ps(k2[N + m]), d[3], v);
    _mm512_storeu_ps(s + m * kLanes, v);
  }
}

DCF_AVX512_INLINE __mmask16 Visible(const TileData& td, int64_t p) {
  const __m512i pv = _mm512_set1_epi32(static_cast<int>(p));
  return _mm512_cmple_epi32_mask(td.lo, pv) & _mm512_cmpge_epi32_mask(td.hi, pv);
}

// The rows of keys [p0, p0 + n) as f32: pointers into the segments (f32 rows) or widened
// copies in `buf` (16-bit rows; widening is exact).
template <DType D>
DCF_AVX512 void KeyRows(const KvRowLayout& layout, const KeySegment* segments, int num_segments,
                        int64_t p0, int n, float* buf, const float** rows) {
  using T = typename VecElem<D>::T;
  const int row = layout.row_floats();
  int si = 0;
  for (int j = 0; j < n; ++j) {
    const int64_t p = p0 + j;
    while (p >= segments[si].pos0 + segments[si].count) ++si;
    const KeySegment& seg = segments[si];
    const T* src = static_cast<const T*>(seg.rows) + (p - seg.pos0) * seg.stride;
    if constexpr (D == DType::kF32) {
      rows[j] = src;
    } else {
      float* dst = buf + static_cast<int64_t>(j) * row;
      int c = 0;
      for (; c + 16 <= row; c += 16) _mm512_storeu_ps(dst + c, VecElem<D>::Load(src + c));
      if (c < row) {
        const __mmask16 m = TailMask(row - c);
        _mm512_mask_storeu_ps(dst + c, m, VecElem<D>::LoadMasked(m, src + c));
      }
      rows[j] = dst;
    }
  }
}

template <DType D>
DCF_AVX512 void AttendTileImpl(const KvRowLayout& layout, const QueryTile& tile,
                               const KeySegment* segments, int num_segments, float* scratch,
                               float* out, int64_t out_stride) {
  const int N = layout.n_head, hd = layout.head_dim;
  const int count = tile.count;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t first = FirstKeptPosition(tile.window, static_cast<int>(tile.pos0));
  const int64_t last = tile.pos0 + count - 1;
  const int64_t L = last - first + 1;  // keys any query of the tile sees
  const int64_t NL = static_cast<int64_t>(N) * kLanes;

  float* S = scratch;                                  // [L][N][16] scores, then P
  float* qt = S + L * NL;                              // [N][hd][16]
  float* terms = qt + NL * hd;                         // [2][5N][16]
  float* mx = terms + 2 * 5 * NL;                      // [N][16]
  float* inv = mx + NL;                                // [N][16] sum, then 1 / sum
  float* acc = inv + NL;                               // [N][hd][16] output tile
  float* wide = acc + NL * hd;                         // [kKeyBlock][row] widened rows

  TileData td;
  td.N = N;
  td.hd = hd;
  alignas(64) int lo[kLanes], hi[kLanes];
  for (int i = 0; i < kLanes; ++i) {
    lo[i] = i < count ? FirstKeptPosition(tile.window, static_cast<int>(tile.pos0 + i)) : INT_MAX;
    hi[i] = i < count ? static_cast<int>(tile.pos0 + i) : INT_MIN;
  }
  td.lo = _mm512_load_si512(lo);
  td.hi = _mm512_load_si512(hi);
  // Transpose the query side; lanes past count hold zeros.
  const int64_t dw_stride = static_cast<int64_t>(kC) * 2 * kRank * N;
  for (int i = 0; i < kLanes; ++i) {
    const bool on = i < count;
    const float* qi = tile.q + i * tile.q_stride;
    for (int e = 0; e < N * hd; ++e) qt[e * kLanes + i] = on ? qi[e] : 0.0f;
    for (int b = 0; b < 2; ++b) {
      const float* w = tile.dw + i * dw_stride + (2 * b) * 2 * kRank * N;  // branch 0 or 2
      const float* g = tile.g + i * tile.g_stride + (2 * b) * N;
      float* t = terms + b * 5 * NL;
      for (int e = 0; e < 4 * N; ++e) t[e * kLanes + i] = on ? w[e] : 0.0f;
      for (int m = 0; m < N; ++m) t[(4 * N + m) * kLanes + i] = on ? 1.0f + g[m] : 0.0f;
    }
  }
  td.qt = qt;
  td.terms[0] = terms;
  td.terms[1] = terms + 5 * NL;

  const float* rows[kKeyBlock];
  const int ko = layout.k_offset();
  const int pre = layout.branch_offset(0), post = layout.branch_offset(1);
  const int kb = 2 * kRank * N;  // G's offset in a branch

  // Pass 1: scores, pre-compose and the running max, per key.
  for (int n = 0; n < N; ++n) _mm512_storeu_ps(mx + n * kLanes, _mm512_set1_ps(-INFINITY));
  for (int64_t b0 = first; b0 <= last; b0 += kKeyBlock) {
    const int nb = static_cast<int>(std::min<int64_t>(kKeyBlock, last + 1 - b0));
    KeyRows<D>(layout, segments, num_segments, b0, nb, wide, rows);
    int j = 0;
    for (; j + 4 <= nb; j += 4) {
      const float* k[4] = {rows[j] + ko, rows[j + 1] + ko, rows[j + 2] + ko, rows[j + 3] + ko};
      float* s[4];
      for (int r = 0; r < 4; ++r) s[r] = S + (b0 - first + j + r) * NL;
      ScoresTile<4>(td, k, scale, s);
    }
    for (; j < nb; ++j) {
      float* s = S + (b0 - first + j) * NL;
      const float* k = rows[j] + ko;
      ScoresTile<1>(td, &k, scale, &s);
    }
    for (j = 0; j < nb; ++j) {
      float* s = S + (b0 - first + j) * NL;
      if (tile.compose) ComposeTile(N, td.terms[0], rows[j] + pre, rows[j] + pre + kb, s);
      const __mmask16 vis = Visible(td, b0 + j);
      for (int n = 0; n < N; ++n) {
        const __m512 m = _mm512_loadu_ps(mx + n * kLanes);
        _mm512_storeu_ps(mx + n * kLanes,
                         _mm512_mask_max_ps(m, vis, m, _mm512_loadu_ps(s + n * kLanes)));
      }
    }
  }

  // Pass 2: exp and the running sum, per key in position order.
  for (int n = 0; n < N; ++n) _mm512_storeu_ps(inv + n * kLanes, _mm512_setzero_ps());
  for (int64_t j = 0; j < L; ++j) {
    const __mmask16 vis = Visible(td, first + j);
    float* s = S + j * NL;
    for (int n = 0; n < N; ++n) {
      const __m512 e = ExpNonPositive(
          _mm512_sub_ps(_mm512_loadu_ps(s + n * kLanes), _mm512_loadu_ps(mx + n * kLanes)));
      _mm512_storeu_ps(s + n * kLanes, e);
      const __m512 sum = _mm512_loadu_ps(inv + n * kLanes);
      _mm512_storeu_ps(inv + n * kLanes, _mm512_mask_add_ps(sum, vis, sum, e));
    }
  }
  for (int n = 0; n < N; ++n) {
    _mm512_storeu_ps(inv + n * kLanes,
                     _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_loadu_ps(inv + n * kLanes)));
  }

  // Pass 3: per block of keys, normalise and post-compose, then accumulate P x V.
  for (int64_t e = 0; e < NL * hd; e += 16) _mm512_storeu_ps(acc + e, _mm512_setzero_ps());
  for (int64_t b0 = first; b0 <= last; b0 += kKeyBlock) {
    const int nb = static_cast<int>(std::min<int64_t>(kKeyBlock, last + 1 - b0));
    KeyRows<D>(layout, segments, num_segments, b0, nb, wide, rows);
    __mmask16 vis[kKeyBlock];
    for (int j = 0; j < nb; ++j) {
      float* s = S + (b0 - first + j) * NL;
      for (int n = 0; n < N; ++n) {
        _mm512_storeu_ps(s + n * kLanes, _mm512_mul_ps(_mm512_loadu_ps(s + n * kLanes),
                                                       _mm512_loadu_ps(inv + n * kLanes)));
      }
      if (tile.compose) ComposeTile(N, td.terms[1], rows[j] + post, rows[j] + post + kb, s);
      vis[j] = Visible(td, b0 + j);
    }
    const int voff = layout.v_offset();
    const float* P = S + (b0 - first) * NL;
    for (int n = 0; n < N; ++n) {
      for (int d0 = 0; d0 < hd; d0 += 16) {
        const int dn = std::min(16, hd - d0);
        float* an = acc + (static_cast<int64_t>(n) * hd + d0) * kLanes;
        __m512 a[16];
#pragma GCC unroll 16
        for (int dd = 0; dd < 16; ++dd) {
          if (dd < dn) a[dd] = _mm512_loadu_ps(an + dd * kLanes);
        }
        for (int j = 0; j < nb; ++j) {
          const __m512 pv = _mm512_loadu_ps(P + j * NL + n * kLanes);
          const float* v = rows[j] + voff + n * hd + d0;
#pragma GCC unroll 16
          for (int dd = 0; dd < 16; ++dd) {
            if (dd < dn) a[dd] = _mm512_mask3_fmadd_ps(pv, _mm512_set1_ps(v[dd]), a[dd], vis[j]);
          }
        }
#pragma GCC unroll 16
        for (int dd = 0; dd < 16; ++dd) {
          if (dd < dn) _mm512_storeu_ps(an + dd * kLanes, a[dd]);
        }
      }
    }
  }

  // The output tile back to rows.
  for (int i = 0; i < count; ++i) {
    float* o = out + i * out_stride;
    for (int e = 0; e < N * hd; ++e) o[e] = acc[e * kLanes + i];
  }
}

}  // namespace

int64_t AttendTileAvx512ScratchFloats(const KvRowLayout& layout, int64_t max_keys) {
  const int64_t NL = static_cast<int64_t>(layout.n_head) * kLanes;
  const int64_t L = max_keys + kLanes - 1;
  return L * NL + NL * layout.head_dim + 2 * 5 * NL + 2 * NL + NL * layout.head_dim +
         static_cast<int64_t>(kKeyBlock) * layout.row_floats();
}

void AttendTileAvx512(const KvRowLayout& layout, const QueryTile& tile,
                      const KeySegment* segments, int num_segments, DType dtype, float* scratch,
                      float* out, int64_t out_stride) {
  switch (dtype) {
    case DType::kF32:
      return AttendTileImpl<DType::kF32>(layout, tile, segments, num_segments, scratch, out,
                                         out_stride);
    case DType::kBF16:
      return AttendTileImpl<DType::kBF16>(layout, tile, segments, num_segments, scratch, out,
                                          out_stride);
    case DType::kF16:
      return AttendTileImpl<DType::kF16>(layout, tile, segments, num_segments, scratch, out,
                                         out_stride);
  }
}

}  // namespace dcf::cpu::kernels
