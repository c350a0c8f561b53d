// AVX-512 version of cpu::AttendTile (dcmha.h): up to 32 consecutive queries of one sequence
// attend at once, in groups of 16 with one query per vector lane. The keys go by blocks of 32
// (f32 rows read in place, 16-bit rows widened once per block for the whole tile), and the
// loops are GEMM-shaped (a vector of 16 queries' values times a broadcast key element,
// accumulated):
//   1. per key: scores S[key][head][query] = Q^T tile x broadcast K elements, pre-compose,
//      running max;
//   2. per key: exp(S - max) and the running sum, per head and query;
//   3. per block of keys: normalise, post-compose, then PV = P x broadcast V elements into
//      the output tile [head][dim][query], both groups sharing each broadcast V element over
//      the keys they both see.
// Bit-identical to AttendOneAvx512 (dcmha_avx512.cc) for each query: every reduction of that
// kernel is reproduced per lane in its own order. A head's dot product there sums 16 lanes
// (lane l: the FMA chain over dims l, l + 16, ...) in lane order (SumLanesInOrder16); here
// lane l's chain is its own vector (queries in lanes), added to a running sum in the same
// order. The compose dot products over heads likewise follow Reduce4's tree. Softmax max and sum
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
constexpr int kLanes = 16;     // queries of a lane group
constexpr int kKeyBlock = 32;  // keys packed (and widened) at once

int64_t Up16(int64_t n) { return (n + 15) / 16 * 16; }

// AttendOneAvx512's sums over vector lanes: a head's dot product adds its 16 lane chains in
// lane order (SumLanesInOrder16), which ScoresHead follows with one running sum per dot
// product; the compose's four dot products over heads use Reduce4's tree,
// ((B0 + B2) + (B1 + B3)) with B_b = (p[4b] + p[4b+2]) + (p[4b+1] + p[4b+3]), which
// ComposeTile folds as it goes.

// The tile's query-side data, transposed to one vector per value (lanes = queries).
struct TileData {
  int N = 0, hd = 0;
  __m512i lo, hi;         // visible keys [lo, hi] per lane; empty for lanes past count
  const float* qt;        // [N][hd][16]
  const float* terms[2];  // pre, post: [4N][16] W1 | W2, then [N][16] 1 + G
};

// One head's dot products of NK keys for the 16 queries of each of G lane groups: lane l of
// AttendOneAvx512's accumulator is the FMA chain (from +0) over dims l, l + 16, ...,
// l + 16 (HC - 1), a dim past hd adding +0 (there the masked loads give fma(0, 0, a)); the dot
// product is ((c_0 + c_1) + c_2) + ... + c_15. Two chains at a time (2 G NK accumulators in
// flight) are added to the running sum as they finish. Group g's queries at qt[g] ([hd][16]),
// key r's head at k[r] (f32, dims contiguous); out[g][r] = scale * the dot product.
template <int HC, int G, int NK>
DCF_AVX512_INLINE void ScoresHead(const float* const* qt, const float* const* k, int hd,
                                  __m512 scale, __m512 (*out)[NK]) {
  const __m512 zero = _mm512_setzero_ps();
  __m512 sum[G][NK];
#pragma GCC unroll 8
  for (int l = 0; l < kLanes; l += 2) {
    __m512 a[2][G][NK];
#pragma GCC unroll 2
    for (int e = 0; e < 2; ++e) {
#pragma GCC unroll 2
      for (int g = 0; g < G; ++g) {
#pragma GCC unroll 8
        for (int r = 0; r < NK; ++r) a[e][g][r] = zero;
      }
    }
#pragma GCC unroll 8
    for (int c = 0; c < HC; ++c) {
#pragma GCC unroll 2
      for (int e = 0; e < 2; ++e) {
        const int d = l + e + 16 * c;
        if (c == HC - 1 && d >= hd) {
#pragma GCC unroll 2
          for (int g = 0; g < G; ++g) {
#pragma GCC unroll 8
            for (int r = 0; r < NK; ++r) a[e][g][r] = _mm512_add_ps(a[e][g][r], zero);
          }
          continue;
        }
#pragma GCC unroll 2
        for (int g = 0; g < G; ++g) {
          const __m512 qv = _mm512_loadu_ps(qt[g] + d * kLanes);
#pragma GCC unroll 8
          for (int r = 0; r < NK; ++r) {
            a[e][g][r] = _mm512_fmadd_ps(qv, _mm512_set1_ps(k[r][d]), a[e][g][r]);
          }
        }
      }
    }
#pragma GCC unroll 2
    for (int g = 0; g < G; ++g) {
#pragma GCC unroll 8
      for (int r = 0; r < NK; ++r) {
        sum[g][r] = l == 0 ? a[0][g][r] : _mm512_add_ps(sum[g][r], a[0][g][r]);
        sum[g][r] = _mm512_add_ps(sum[g][r], a[1][g][r]);
      }
    }
  }
#pragma GCC unroll 2
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 8
    for (int r = 0; r < NK; ++r) out[g][r] = _mm512_mul_ps(sum[g][r], scale);
  }
}

// S[g][r][n] = scale * <q_n, k_n> of NK keys for the queries of G lane groups, n < N; key r's
// head n at k[r] + n * hd (f32).
template <int HC, int G, int NK>
DCF_AVX512 void ScoresTile(const TileData* const* td, const float* const* k, float scale,
                           float* const (*S)[NK]) {
  const int N = td[0]->N, hd = td[0]->hd;
  const __m512 sv = _mm512_set1_ps(scale);
  for (int n = 0; n < N; ++n) {
    const float* kn[NK];
#pragma GCC unroll 8
    for (int r = 0; r < NK; ++r) kn[r] = Opaque(k[r] + n * hd);
    const float* qn[G];
#pragma GCC unroll 2
    for (int g = 0; g < G; ++g) qn[g] = td[g]->qt + static_cast<int64_t>(n) * hd * kLanes;
    __m512 v[G][NK];
    ScoresHead<HC, G, NK>(qn, kn, hd, sv, v);
#pragma GCC unroll 2
    for (int g = 0; g < G; ++g) {
#pragma GCC unroll 8
      for (int r = 0; r < NK; ++r) _mm512_storeu_ps(S[g][r] + n * kLanes, v[g][r]);
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
  // accumulators is the chain over heads l, l + 16, ... (a lane with no head, l >= N, stays
  // +0: 0 + 0 is +0). The four dot products share each load of s, and Reduce4's tree is folded as
  // the lane quads are done: B_b per quad, then (B0 + B2) + (B1 + B3).
  const int n16 = static_cast<int>(Up16(N));
  __m512 b0[4], b1[4], d[4];
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    __m512 a[4][4];  // [dot][lane of the quad]
#pragma GCC unroll 4
    for (int e = 0; e < 4; ++e) {
      const int l = 4 * q + e;
#pragma GCC unroll 4
      for (int w = 0; w < 4; ++w) a[w][e] = zero;
      if (l >= N) continue;
      for (int m = l; m < n16; m += 16) {
        if (m < N) {
          const __m512 sv = _mm512_loadu_ps(s + m * kLanes);
          a[0][e] = _mm512_fmadd_ps(_mm512_loadu_ps(qt + m * kLanes), sv, a[0][e]);
          a[1][e] = _mm512_fmadd_ps(_mm512_loadu_ps(qt + (N + m) * kLanes), sv, a[1][e]);
          a[2][e] = _mm512_fmadd_ps(_mm512_set1_ps(kw[m]), sv, a[2][e]);
          a[3][e] = _mm512_fmadd_ps(_mm512_set1_ps(kw[N + m]), sv, a[3][e]);
        } else {
#pragma GCC unroll 4
          for (int w = 0; w < 4; ++w) a[w][e] = _mm512_add_ps(a[w][e], zero);
        }
      }
    }
#pragma GCC unroll 4
    for (int w = 0; w < 4; ++w) {
      const __m512 bq =
          _mm512_add_ps(_mm512_add_ps(a[w][0], a[w][2]), _mm512_add_ps(a[w][1], a[w][3]));
      if (q == 0) b0[w] = bq;
      if (q == 1) b1[w] = bq;
      if (q == 2) b0[w] = _mm512_add_ps(b0[w], bq);
      if (q == 3) d[w] = _mm512_add_ps(b0[w], _mm512_add_ps(b1[w], bq));
    }
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

// acc[g][dd] (dims d .. d + DN of one head, [DN][16] for each of G lane groups) +=
// P[g][j] * V[j][d + dd] over the nb keys of a block in order, each key masked to the queries
// that see it: AccumulateHeadGroup's chain per lane. Group g's probabilities of key j at
// P[g] + j * p_stride; the values of those dims at v[j] + off. Two groups share each
// broadcast V element (fewer loads per FMA).
template <int G, int DN>
DCF_AVX512 void PvBlock(const float* const* P, int64_t p_stride, const float* const* v, int off,
                        const __mmask16* const* vis, int nb, float* const* acc) {
  __m512 a[G][DN];
#pragma GCC unroll 2
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 16
    for (int dd = 0; dd < DN; ++dd) a[g][dd] = _mm512_loadu_ps(acc[g] + dd * kLanes);
  }
  for (int j = 0; j < nb; ++j) {
    const float* vj = Opaque(v[j] + off);
#pragma GCC unroll 2
    for (int g = 0; g < G; ++g) {
      const __m512 pv = _mm512_loadu_ps(P[g] + j * p_stride);
      const __mmask16 m = vis[g][j];
#pragma GCC unroll 16
      for (int dd = 0; dd < DN; ++dd) {
        a[g][dd] = _mm512_mask3_fmadd_ps(pv, _mm512_set1_ps(vj[dd]), a[g][dd], m);
      }
    }
  }
#pragma GCC unroll 2
  for (int g = 0; g < G; ++g) {
#pragma GCC unroll 16
    for (int dd = 0; dd < DN; ++dd) _mm512_storeu_ps(acc[g] + dd * kLanes, a[g][dd]);
  }
}

// PvBlock over a head's hd dims: G = 1 in chunks of 16 dims, G = 2 in chunks of 8, then
// smaller ones (each dim's chain is its own, so how the dims are cut changes nothing).
template <int G>
DCF_AVX512 void PvHead(int hd, const float* const* P, int64_t p_stride, const float* const* v,
                       int off, const __mmask16* const* vis, int nb, float* const* acc) {
  constexpr int kWide = G == 1 ? 16 : 8;
  float* an[G];
  int d0 = 0;
  while (d0 < hd) {
    for (int g = 0; g < G; ++g) an[g] = acc[g] + d0 * kLanes;
    const int left = hd - d0;
    if (left >= kWide) {
      PvBlock<G, kWide>(P, p_stride, v, off + d0, vis, nb, an);
      d0 += kWide;
    } else if (left >= 8) {
      PvBlock<G, 8>(P, p_stride, v, off + d0, vis, nb, an);
      d0 += 8;
    } else if (left >= 4) {
      PvBlock<G, 4>(P, p_stride, v, off + d0, vis, nb, an);
      d0 += 4;
    } else if (left >= 2) {
      PvBlock<G, 2>(P, p_stride, v, off + d0, vis, nb, an);
      d0 += 2;
    } else {
      PvBlock<G, 1>(P, p_stride, v, off + d0, vis, nb, an);
      d0 += 1;
    }
  }
}

DCF_AVX512_INLINE __mmask16 Visible(const TileData& td, int64_t p) {
  const __m512i pv = _mm512_set1_epi32(static_cast<int>(p));
  return _mm512_cmple_epi32_mask(td.lo, pv) & _mm512_cmpge_epi32_mask(td.hi, pv);
}

template <DType D>
DCF_AVX512_INLINE void CopyWiden(const typename VecElem<D>::T* src, int count, float* dst) {
  int c = 0;
  for (; c + 16 <= count; c += 16) _mm512_storeu_ps(dst + c, VecElem<D>::Load(src + c));
  if (c < count) {
    const __mmask16 m = TailMask(count - c);
    _mm512_mask_storeu_ps(dst + c, m, VecElem<D>::LoadMasked(m, src + c));
  }
}

// f32 views of the keys [p0, p0 + n) of the segments, the part at row offset `part` (K or V,
// [N * hd]) and the key-side branch at row offset `branch` ([5N]): f32 rows are read in
// place; 16-bit rows are widened (exactly) into `buf` ([n][N * hd + 16]) and `tbuf` ([n][5N]).
struct BlockRows {
  const float* part[kKeyBlock];
  const float* terms[kKeyBlock];
};

template <DType D>
DCF_AVX512 void GetBlock(const KvRowLayout& layout, const KeySegment* segments, int64_t p0, int n,
                         int part, int branch, float* buf, float* tbuf, BlockRows* br) {
  using T = typename VecElem<D>::T;
  const int E = layout.n_head * layout.head_dim;
  const int nt = layout.BranchFloats();
  int si = 0;
  for (int j = 0; j < n; ++j) {
    const int64_t p = p0 + j;
    while (p >= segments[si].pos0 + segments[si].count) ++si;
    const KeySegment& seg = segments[si];
    const T* src = static_cast<const T*>(seg.rows) + (p - seg.pos0) * seg.stride;
    if constexpr (D == DType::kF32) {
      br->part[j] = src + part;
      br->terms[j] = src + branch;
    } else {
      float* dst = buf + static_cast<int64_t>(j) * (E + kLanes);
      float* tdst = tbuf + static_cast<int64_t>(j) * nt;
      CopyWiden<D>(src + part, E, dst);
      CopyWiden<D>(src + branch, nt, tdst);
      br->part[j] = dst;
      br->terms[j] = tdst;
    }
  }
}

// dst [count][16]: element off + e of rows[i] at dst[e * 16 + i]; lane i is 0 where rows[i] is
// null.
DCF_AVX512 void RowsToLanes(const float* const* rows, int64_t off, int count, float* dst) {
  __m512 in[kLanes], t[kLanes];
  for (int e0 = 0; e0 < count; e0 += kLanes) {
    const __mmask16 m = TailMask(count - e0);
    for (int i = 0; i < kLanes; ++i) {
      in[i] =
          rows[i] != nullptr ? _mm512_maskz_loadu_ps(m, rows[i] + off + e0) : _mm512_setzero_ps();
    }
    Transpose16(in, t);
    const int n = std::min(kLanes, count - e0);
    for (int e = 0; e < n; ++e) _mm512_storeu_ps(dst + (e0 + e) * kLanes, t[e]);
  }
}

// The inverse for the non-null rows: rows[i][e] = src[e * 16 + i], e < count.
DCF_AVX512 void LanesToRows(const float* src, int count, float* const* rows) {
  __m512 in[kLanes], t[kLanes];
  for (int e0 = 0; e0 < count; e0 += kLanes) {
    const int n = std::min(kLanes, count - e0);
    for (int e = 0; e < kLanes; ++e) {
      in[e] = e < n ? _mm512_loadu_ps(src + (e0 + e) * kLanes) : _mm512_setzero_ps();
    }
    Transpose16(in, t);
    const __mmask16 m = TailMask(n);
    for (int i = 0; i < kLanes; ++i) {
      if (rows[i] != nullptr) _mm512_mask_storeu_ps(rows[i] + e0, m, t[i]);
    }
  }
}

// Floats from one key's scores [N][16] to the next in a group's S: one vector more than
// they take, so the P x V loop, which reads one head's vector of every key of a block, does
// not find them all in a few cache sets (N * 64 bytes apart: a power of two for 8 or 16
// heads).
int64_t KeyStride(int N) { return static_cast<int64_t>(N + 1) * kLanes; }

// Floats of one lane group's state for queries seeing at most max_keys keys each.
int64_t GroupFloats(const KvRowLayout& layout, int64_t max_keys) {
  const int64_t NL = static_cast<int64_t>(layout.n_head) * kLanes;
  return (max_keys + kLanes - 1) * KeyStride(layout.n_head) + 2 * NL * layout.head_dim +
         2 * 5 * NL + 2 * NL;
}

// One lane group: 16 consecutive queries of the tile, its keys [first, last] and its state.
struct Group {
  TileData td;
  int count = 0;
  int64_t pos0 = 0, first = 0, last = 0;
  float* S;    // [last - first + 1][N][16] scores, then probabilities
  float* mx;   // [N][16]
  float* inv;  // [N][16] sum, then 1 / sum
  float* acc;  // [N][hd][16] output
};

// PvHead of group gi alone over the block's keys [ja, jb).
DCF_AVX512_INLINE void PvOneGroup(const Group& g, int64_t b0, int n, int ja, int jb,
                                  const BlockRows& br, const __mmask16* vis) {
  if (ja >= jb) return;
  const int64_t SL = KeyStride(g.td.N);
  const float* P = g.S + (b0 - g.first + ja) * SL + n * kLanes;
  const __mmask16* vm = vis + ja;
  float* an = g.acc + static_cast<int64_t>(n) * g.td.hd * kLanes;
  PvHead<1>(g.td.hd, &P, SL, br.part + ja, n * g.td.hd, &vm, jb - ja, &an);
}

// One key's scores s [N][16] of group g: pre-compose (key terms kt, [5N]), then the running max
// of the queries that see the key (vis).
DCF_AVX512_INLINE void PreComposeAndMax(const Group& g, bool compose, float* s, const float* kt,
                                        __mmask16 vis) {
  const int N = g.td.N;
  if (compose) ComposeTile(N, g.td.terms[0], kt, kt + 2 * kRank * N, s);
  for (int n = 0; n < N; ++n) {
    const __m512 m = _mm512_loadu_ps(g.mx + n * kLanes);
    _mm512_storeu_ps(g.mx + n * kLanes,
                     _mm512_mask_max_ps(m, vis, m, _mm512_loadu_ps(s + n * kLanes)));
  }
}

// Pass 1 over the block's keys [ja, jb) for G lane groups: scores (4 keys at a time), then
// each key's pre-compose and running max.
template <int HC, int G>
DCF_AVX512 void ScoresRange(const Group* const* g, int64_t b0, int ja, int jb, const BlockRows& br,
                            bool compose, float scale) {
  if (ja >= jb) return;
  const int64_t SL = KeyStride(g[0]->td.N);
  const TileData* td[G];
  for (int gi = 0; gi < G; ++gi) td[gi] = &g[gi]->td;
  int j = ja;
  for (; j + 4 <= jb; j += 4) {
    float* s[G][4];
    for (int gi = 0; gi < G; ++gi) {
      for (int r = 0; r < 4; ++r) s[gi][r] = g[gi]->S + (b0 - g[gi]->first + j + r) * SL;
    }
    ScoresTile<HC, G, 4>(td, br.part + j, scale, s);
    for (int gi = 0; gi < G; ++gi) {
      for (int r = 0; r < 4; ++r) {
        PreComposeAndMax(*g[gi], compose, s[gi][r], br.terms[j + r], Visible(*td[gi], b0 + j + r));
      }
    }
  }
  for (; j < jb; ++j) {
    float* s[G][1];
    for (int gi = 0; gi < G; ++gi) s[gi][0] = g[gi]->S + (b0 - g[gi]->first + j) * SL;
    ScoresTile<HC, G, 1>(td, br.part + j, scale, s);
    for (int gi = 0; gi < G; ++gi) {
      PreComposeAndMax(*g[gi], compose, s[gi][0], br.terms[j], Visible(*td[gi], b0 + j));
    }
  }
}

template <DType D, int HC>
DCF_AVX512 void AttendTileImpl(const KvRowLayout& layout, const QueryTile& tile,
                               const KeySegment* segments, float* scratch, float* out,
                               int64_t out_stride) {
  const int N = layout.n_head, hd = layout.head_dim;
  const int E = N * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t NL = static_cast<int64_t>(N) * kLanes;
  const int64_t SL = KeyStride(N);  // floats from one key's scores to the next
  const int64_t max_keys =
      tile.pos0 + tile.count - 1 - FirstKeptPosition(tile.window, static_cast<int>(tile.pos0)) + 1;
  const int num_groups = (tile.count + kLanes - 1) / kLanes;

  // Shared: a block of keys widened from 16 bits (unused for f32 rows).
  // [kKeyBlock][N * hd + 16]: the rows one vector apart more than they take, like S's keys.
  float* buf = scratch;
  float* tbuf = buf + static_cast<int64_t>(kKeyBlock) * (E + kLanes);  // [kKeyBlock][5N]
  float* next = tbuf + static_cast<int64_t>(kKeyBlock) * layout.BranchFloats();
  Group groups[QueryTile::kMaxQueries / kLanes];
  const int64_t dw_stride = static_cast<int64_t>(kC) * 2 * kRank * N;
  for (int gi = 0; gi < num_groups; ++gi) {
    Group& g = groups[gi];
    g.count = std::min(kLanes, tile.count - gi * kLanes);
    g.pos0 = tile.pos0 + gi * kLanes;
    g.first = FirstKeptPosition(tile.window, static_cast<int>(g.pos0));
    g.last = g.pos0 + g.count - 1;
    g.S = next;
    float* qt = g.S + (max_keys + kLanes - 1) * SL;  // [N][hd][16]
    float* terms = qt + NL * hd;                     // [2][5N][16]
    g.mx = terms + 2 * 5 * NL;
    g.inv = g.mx + NL;
    g.acc = g.inv + NL;
    next += GroupFloats(layout, max_keys);
    TileData& td = g.td;
    td.N = N;
    td.hd = hd;
    alignas(64) int lo[kLanes], hi[kLanes];
    for (int i = 0; i < kLanes; ++i) {
      lo[i] = i < g.count ? FirstKeptPosition(tile.window, static_cast<int>(g.pos0 + i)) : INT_MAX;
      hi[i] = i < g.count ? static_cast<int>(g.pos0 + i) : INT_MIN;
    }
    td.lo = _mm512_load_si512(lo);
    td.hi = _mm512_load_si512(hi);
    // Transpose the query side; lanes past count hold zeros.
    const float* rows[kLanes];
    for (int i = 0; i < kLanes; ++i) {
      rows[i] = i < g.count ? tile.q + (gi * kLanes + i) * tile.q_stride : nullptr;
    }
    RowsToLanes(rows, 0, E, qt);
    for (int b = 0; b < 2; ++b) {
      float* tb = terms + b * 5 * NL;
      for (int i = 0; i < kLanes; ++i) {
        rows[i] = i < g.count ? tile.dw + (gi * kLanes + i) * dw_stride : nullptr;
      }
      RowsToLanes(rows, (2 * b) * 2 * kRank * N, 4 * N, tb);  // W1 | W2 of branch 0 or 2
      for (int i = 0; i < kLanes; ++i) {
        rows[i] = i < g.count ? tile.g + (gi * kLanes + i) * tile.g_stride : nullptr;
      }
      float* g1 = tb + 4 * NL;
      RowsToLanes(rows, (2 * b) * N, N, g1);  // G of branch 0 or 2, then 1 + G
      const __mmask16 on = TailMask(g.count);
      for (int m = 0; m < N; ++m) {
        const __m512 v = _mm512_loadu_ps(g1 + m * kLanes);
        _mm512_storeu_ps(g1 + m * kLanes, _mm512_mask_add_ps(v, on, _mm512_set1_ps(1.0f), v));
      }
    }
    td.qt = qt;
    td.terms[0] = terms;
    td.terms[1] = terms + 5 * NL;
    for (int n = 0; n < N; ++n) _mm512_storeu_ps(g.mx + n * kLanes, _mm512_set1_ps(-INFINITY));
  }
  const int64_t first = groups[0].first;
  const int64_t last = groups[num_groups - 1].last;
  const int kb = 2 * kRank * N;  // G's offset in a branch
  BlockRows br;

  // Pass 1: scores, pre-compose and the running max, per key.
  for (int64_t b0 = first; b0 <= last; b0 += kKeyBlock) {
    const int nb = static_cast<int>(std::min<int64_t>(kKeyBlock, last + 1 - b0));
    GetBlock<D>(layout, segments, b0, nb, layout.k_offset(), layout.branch_offset(0), buf, tbuf,
                &br);
    // The block's keys each group sees, [j0s[g], j1s[g]); those both see are done together
    // (sharing every broadcast K element), the others by one group.
    int j0s[2], j1s[2];
    for (int gi = 0; gi < num_groups; ++gi) {
      j0s[gi] = static_cast<int>(std::max<int64_t>(0, groups[gi].first - b0));
      j1s[gi] = static_cast<int>(std::min<int64_t>(nb, groups[gi].last + 1 - b0));
    }
    const Group* g0 = &groups[0];
    const Group* g1 = &groups[1];
    if (num_groups == 1) {
      ScoresRange<HC, 1>(&g0, b0, j0s[0], j1s[0], br, tile.compose, scale);
    } else {
      const int ja = std::max(j0s[0], j0s[1]), jb = std::min(j1s[0], j1s[1]);
      if (ja >= jb) {
        ScoresRange<HC, 1>(&g0, b0, j0s[0], j1s[0], br, tile.compose, scale);
        ScoresRange<HC, 1>(&g1, b0, j0s[1], j1s[1], br, tile.compose, scale);
      } else {
        const Group* both[2] = {g0, g1};
        ScoresRange<HC, 1>(&g0, b0, j0s[0], ja, br, tile.compose, scale);
        ScoresRange<HC, 2>(both, b0, ja, jb, br, tile.compose, scale);
        ScoresRange<HC, 1>(&g1, b0, jb, j1s[1], br, tile.compose, scale);
      }
    }
  }

  // Pass 2: exp and the running sum, per key in position order (8 heads at a time, their max
  // and sum in registers).
  for (int gi = 0; gi < num_groups; ++gi) {
    const Group& g = groups[gi];
    for (int n0 = 0; n0 < N; n0 += 8) {
      const int nh = std::min(8, N - n0);
      __m512 mx[8], sum[8];
#pragma GCC unroll 8
      for (int h = 0; h < 8; ++h) {
        if (h < nh) mx[h] = _mm512_loadu_ps(g.mx + (n0 + h) * kLanes);
        sum[h] = _mm512_setzero_ps();
      }
      for (int64_t p = g.first; p <= g.last; ++p) {
        const __mmask16 vis = Visible(g.td, p);
        float* s = g.S + (p - g.first) * SL + n0 * kLanes;
#pragma GCC unroll 8
        for (int h = 0; h < 8; ++h) {
          if (h >= nh) break;
          const __m512 e = ExpNonPositive(_mm512_sub_ps(_mm512_loadu_ps(s + h * kLanes), mx[h]));
          _mm512_storeu_ps(s + h * kLanes, e);
          sum[h] = _mm512_mask_add_ps(sum[h], vis, sum[h], e);
        }
      }
#pragma GCC unroll 8
      for (int h = 0; h < 8; ++h) {
        if (h < nh) {
          _mm512_storeu_ps(g.inv + (n0 + h) * kLanes, _mm512_div_ps(_mm512_set1_ps(1.0f), sum[h]));
        }
      }
    }
    for (int64_t e = 0; e < NL * hd; e += 16) _mm512_storeu_ps(g.acc + e, _mm512_setzero_ps());
  }

  // Pass 3: per block of keys, normalise and post-compose, then accumulate P x V.
  for (int64_t b0 = first; b0 <= last; b0 += kKeyBlock) {
    const int nb = static_cast<int>(std::min<int64_t>(kKeyBlock, last + 1 - b0));
    GetBlock<D>(layout, segments, b0, nb, layout.v_offset(), layout.branch_offset(1), buf, tbuf,
                &br);
    __mmask16 vis[2][kKeyBlock];
    int j0s[2], j1s[2];  // each group's keys of the block
    for (int gi = 0; gi < num_groups; ++gi) {
      const Group& g = groups[gi];
      const int j0 = static_cast<int>(std::max<int64_t>(0, g.first - b0));
      const int j1 = static_cast<int>(std::min<int64_t>(nb, g.last + 1 - b0));
      if (j0 >= j1) {
        j0s[gi] = j1s[gi] = 0;
        continue;
      }
      float* S = g.S + (b0 - g.first) * SL;
      for (int j = j0; j < j1; ++j) {
        float* s = S + j * SL;
        for (int n = 0; n < N; ++n) {
          _mm512_storeu_ps(s + n * kLanes, _mm512_mul_ps(_mm512_loadu_ps(s + n * kLanes),
                                                         _mm512_loadu_ps(g.inv + n * kLanes)));
        }
        const float* kt = br.terms[j];
        if (tile.compose) ComposeTile(N, g.td.terms[1], kt, kt + kb, s);
        vis[gi][j] = Visible(g.td, b0 + j);
      }
      j0s[gi] = j0;
      j1s[gi] = j1;
    }
    // P x V in key order per group: the keys only group 0 sees, those both see (sharing
    // every broadcast V element), then those only group 1 sees.
    for (int n = 0; n < N; ++n) {
      const int off = n * hd;
      if (num_groups == 1) {
        PvOneGroup(groups[0], b0, n, j0s[0], j1s[0], br, vis[0]);
        continue;
      }
      const int ja = std::max(j0s[0], j0s[1]), jb = std::min(j1s[0], j1s[1]);
      if (ja >= jb) {
        PvOneGroup(groups[0], b0, n, j0s[0], j1s[0], br, vis[0]);
        PvOneGroup(groups[1], b0, n, j0s[1], j1s[1], br, vis[1]);
        continue;
      }
      PvOneGroup(groups[0], b0, n, j0s[0], ja, br, vis[0]);
      const float* P[2];
      const __mmask16* vm[2];
      float* an[2];
      for (int gi = 0; gi < 2; ++gi) {
        const Group& g = groups[gi];
        P[gi] = g.S + (b0 - g.first + ja) * SL + n * kLanes;
        vm[gi] = vis[gi] + ja;
        an[gi] = g.acc + static_cast<int64_t>(n) * hd * kLanes;
      }
      PvHead<2>(hd, P, SL, br.part + ja, off, vm, jb - ja, an);
      PvOneGroup(groups[1], b0, n, jb, j1s[1], br, vis[1]);
    }
  }

  // The output tile back to rows.
  for (int gi = 0; gi < num_groups; ++gi) {
    const Group& g = groups[gi];
    float* rows[kLanes];
    for (int i = 0; i < kLanes; ++i) {
      rows[i] = i < g.count ? out + (gi * kLanes + i) * out_stride : nullptr;
    }
    LanesToRows(g.acc, E, rows);
  }
}

// AttendTileImpl with HC = ceil(head_dim / 16), 1..8, as a compile-time constant.
template <DType D, int HC = 1>
void AttendTileAnyHd(const KvRowLayout& layout, const QueryTile& tile, const KeySegment* segments,
                     float* scratch, float* out, int64_t out_stride) {
  if constexpr (HC < 8) {
    if ((layout.head_dim + 15) / 16 > HC) {
      return AttendTileAnyHd<D, HC + 1>(layout, tile, segments, scratch, out, out_stride);
    }
  }
  AttendTileImpl<D, HC>(layout, tile, segments, scratch, out, out_stride);
}

}  // namespace

int64_t AttendTileAvx512ScratchFloats(const KvRowLayout& layout, int64_t max_keys) {
  // A tile's queries see at most max_keys + kMaxQueries - 1 keys together (each group's S is
  // sized for that: simpler than per group, and the same order of size).
  const int64_t tile_keys = max_keys + QueryTile::kMaxQueries - 1;
  return static_cast<int64_t>(kKeyBlock) *
             (layout.n_head * layout.head_dim + kLanes + layout.BranchFloats()) +
         QueryTile::kMaxQueries / kLanes * GroupFloats(layout, tile_keys);
}

void AttendTileAvx512(const KvRowLayout& layout, const QueryTile& tile, const KeySegment* segments,
                      int num_segments, DType dtype, float* scratch, float* out,
                      int64_t out_stride) {
  switch (dtype) {
    case DType::kF32:
      return AttendTileAnyHd<DType::kF32>(layout, tile, segments, scratch, out, out_stride);
    case DType::kBF16:
      return AttendTileAnyHd<DType::kBF16>(layout, tile, segments, scratch, out, out_stride);
    case DType::kF16:
      return AttendTileAnyHd<DType::kF16>(layout, tile, segments, scratch, out, out_stride);
    case DType::kI8:  // a weight dtype only: no KV cache holds int8 rows
      break;
  }
}

}  // namespace dcf::cpu::kernels
