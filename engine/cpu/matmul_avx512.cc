// AVX-512 kernel of cpu::MatMul (see packed_matrix.h for the layout). Every function here
// with vector code carries the target attribute, so the file compiles for baseline x86-64
// and only runs when cpu_isa.h found AVX-512 (the packing of x is plain C++).
// GCC 12 warns about the deliberately undefined vectors inside its own AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <limits>
#include <memory>

#include "engine/cpu/cpu_isa.h"
#include "engine/cpu/dcmha_avx512_inl.h"
#include "engine/cpu/matmul_kernels.h"
#include "engine/weights/int8_quant.h"

#define DCF_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")))
#define DCF_AVX512_INLINE DCF_AVX512 inline __attribute__((always_inline))
#define DCF_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")))
#define DCF_VNNI_INLINE DCF_VNNI inline __attribute__((always_inline))

namespace dcf::cpu::kernels {
namespace {

constexpr int kPanel = kPanelOutputs;

// The 32 weights of column k of a panel as two vectors of 16 floats (outputs 0-15, 16-31).
template <int WT>
DCF_AVX512_INLINE void LoadColumn(const void* panel, int64_t k, __m512* w0, __m512* w1) {
  if constexpr (WT == kWeightF32) {
    const float* p = static_cast<const float*>(panel) + k * kPanel;
    *w0 = _mm512_loadu_ps(p);
    *w1 = _mm512_loadu_ps(p + 16);
  } else if constexpr (WT == kWeightF16) {
    const uint16_t* p = static_cast<const uint16_t*>(panel) + k * kPanel;
    *w0 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    *w1 = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)));
  } else if constexpr (WT == kWeightI8) {
    // Widened without the scale (Block multiplies by it): exact integers. Two 16-byte loads
    // fold into vpmovsxbd's memory operand (no lane extract).
    const int8_t* p = static_cast<const int8_t*>(panel) + k * kPanel;
    *w0 = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
    *w1 = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16))));
  } else {
    // Pair-interleaved bf16: the low halves are outputs 0-15, the high halves 16-31.
    const uint16_t* p = static_cast<const uint16_t*>(panel) + k * kPanel;
    const __m512i v = _mm512_loadu_si512(p);
    *w0 = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    *w1 = _mm512_castsi512_ps(
        _mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
  }
}

// Prefetches the line(s) `ahead` bytes past the start of column k of a panel (F32: the two
// lines of a column; int8 columns are half a line, so every line is asked for twice).
// Prefetches never fault: past the weights they only cost a request.
template <int WT>
DCF_AVX512_INLINE void PrefetchColumn(const void* panel, int64_t k, int64_t ahead) {
  constexpr int64_t kColumnBytes =
      int64_t{kPanel} * (WT == kWeightF32 ? 4 : WT == kWeightI8 ? 1 : 2);
  const char* p = static_cast<const char*>(panel) + k * kColumnBytes + ahead;
  _mm_prefetch(p, _MM_HINT_T0);
  if constexpr (kColumnBytes > 64) _mm_prefetch(p + 64, _MM_HINT_T0);
}

// Masks of the valid outputs of a panel in its two vectors (outputs 0-15, 16-31).
DCF_AVX512_INLINE void ValidMasks(int valid, __mmask16* m0, __mmask16* m1) {
  *m0 = valid >= 16 ? 0xffff : static_cast<__mmask16>((1u << valid) - 1);
  *m1 = valid >= 32 ? 0xffff : valid <= 16 ? 0 : static_cast<__mmask16>((1u << (valid - 16)) - 1);
}

// The masks of a panel's valid outputs, and MR rows' 32 outputs (two vectors each) set to
// the bias (or 0): where Rows and RowsI8A8 start.
template <int MR>
DCF_AVX512_INLINE void StartRows(const float* bias, int valid, __mmask16* m0, __mmask16* m1,
                                 __m512* y0, __m512* y1) {
  ValidMasks(valid, m0, m1);
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {
    y0[r] = bias != nullptr ? _mm512_maskz_loadu_ps(*m0, bias) : _mm512_setzero_ps();
    y1[r] = bias != nullptr ? _mm512_maskz_loadu_ps(*m1, bias + 16) : _mm512_setzero_ps();
  }
}

// The bf16 scales of one group (32 outputs) as two vectors of 16 floats.
DCF_AVX512_INLINE void LoadScales(const uint16_t* s, __m512* s0, __m512* s1) {
  const __m512i sv = _mm512_loadu_si512(s);
  *s0 = _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(sv)), 16));
  *s1 = _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(sv, 1)), 16));
}

// Columns of a sub-block: kSubBlock, for int8 at most one group (G is 32 or a multiple of
// kSubBlock, so a sub-block never straddles two scales).
template <int WT>
DCF_AVX512_INLINE int64_t SubBlock(int64_t group) {
  if constexpr (WT == kWeightI8) return group < kSubBlock ? group : kSubBlock;
  return kSubBlock;
}

// y0, y1 (32 outputs) += one sub-block's sums a0, a1; int8: times the sub-block's 32 scales
// `s` (one FMA per vector, not a multiply per column).
template <int WT>
DCF_AVX512_INLINE void AddSubBlock(__m512 a0, __m512 a1, const uint16_t* s, __m512* y0,
                                   __m512* y1) {
  if constexpr (WT == kWeightI8) {
    __m512 s0, s1;
    LoadScales(s, &s0, &s1);
    *y0 = _mm512_fmadd_ps(a0, s0, *y0);
    *y1 = _mm512_fmadd_ps(a1, s1, *y1);
  } else {
    *y0 = _mm512_add_ps(a0, *y0);
    *y1 = _mm512_add_ps(a1, *y1);
  }
}

// y[MR, valid outputs of the panel] = x[MR, in] * panel^T (+ bias), the summation rule of
// matmul_kernels.h: columns in sub-blocks, each summed from zero in column order (one FMA
// chain per row and vector), the sub-block sums added to y in order (int8: multiplied by
// their scales in the same FMA).
// x[r][k] is at x[r * xr + k * xk]: rows of the caller's matrix (xr = ldx, xk = 1) or a
// packed group (xr = 1, xk = MR). With `accumulate` the first sub-block is added to y (a
// later column block), else to the bias (or 0). Every row's arithmetic is the same whatever
// MR is, and the same as Row's for one row, so a row's result does not depend on the
// batch. `in` starts at a column block (a multiple of kColumnBlock, hence of the group).
// `prefetch`: bytes ahead of each column read to prefetch (0: none), see StreamsPanels.
// kWeightI8: `scales` [ceil(in / group), 32] bf16 are those of the panel's columns from the
// first of `in`; the int8 weights are widened to exact integers for the multiply-adds.
template <int MR, int WT>
DCF_AVX512 void Block(const float* x, int64_t xr, int64_t xk, const void* panel, int64_t in,
                      const uint16_t* scales, int64_t group, const float* bias, bool accumulate,
                      float* y, int64_t ldy, int valid, int64_t prefetch) {
  __mmask16 m0, m1;
  ValidMasks(valid, &m0, &m1);
  __m512 b0 = _mm512_setzero_ps(), b1 = _mm512_setzero_ps();
  if (bias != nullptr) {
    b0 = _mm512_maskz_loadu_ps(m0, bias);
    b1 = _mm512_maskz_loadu_ps(m1, bias + 16);
  }
  const int64_t sub = SubBlock<WT>(group);
  for (int64_t sb = 0; sb < in; sb += sub) {
    const int64_t se = in - sb < sub ? in : sb + sub;
    __m512 a0[MR], a1[MR];
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) a0[r] = a1[r] = _mm512_setzero_ps();
    for (int64_t k = sb; k < se; ++k) {
      if (prefetch != 0) PrefetchColumn<WT>(panel, k, prefetch);
      __m512 w0, w1;
      LoadColumn<WT>(panel, k, &w0, &w1);
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        const __m512 b = _mm512_set1_ps(x[r * xr + k * xk]);
        a0[r] = _mm512_fmadd_ps(b, w0, a0[r]);
        a1[r] = _mm512_fmadd_ps(b, w1, a1[r]);
      }
    }
    const bool first = sb == 0 && !accumulate;
    const uint16_t* s = WT == kWeightI8 ? scales + (sb / group) * kPanel : nullptr;
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      __m512 y0 = first ? b0 : _mm512_maskz_loadu_ps(m0, y + r * ldy);
      __m512 y1 = first ? b1 : _mm512_maskz_loadu_ps(m1, y + r * ldy + 16);
      AddSubBlock<WT>(a0[r], a1[r], s, &y0, &y1);
      _mm512_mask_storeu_ps(y + r * ldy, m0, y0);
      _mm512_mask_storeu_ps(y + r * ldy + 16, m1, y1);
    }
  }
}

// MR rows (1-3): NS consecutive sub-blocks of `sub` columns, [k0 + c sub, k0 + c sub + len)
// for c < NS, summed as Block sums them (each from zero, in column order) but interleaved, so
// NS x MR x 2 independent FMA chains hide the FMA latency; the sums are then added to y0, y1
// (each row's 32 outputs) in sub-block order, as Block adds them to y. x (row r at
// x + r * ldx), `panel` and `scales` start at column 0; k0 is a multiple of `sub`.
template <int MR, int NS, int WT>
DCF_AVX512_INLINE void RowChains(const float* x, int64_t ldx, const void* panel,
                                 const uint16_t* scales, int64_t group, int64_t sub, int64_t k0,
                                 int64_t len, __m512* y0, __m512* y1) {
  __m512 a0[NS][MR], a1[NS][MR];
#pragma GCC unroll 4
  for (int c = 0; c < NS; ++c) {
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) a0[c][r] = a1[c][r] = _mm512_setzero_ps();
  }
  // int8: the NS sub-blocks are NS streams of sub x 32 bytes (2 KiB; 1 KiB at G = 32), too
  // short for the hardware prefetcher to train on before they end, so a row streamed from
  // memory waited on its lines (1-row products at 52-65% of the read bandwidth, where F16's
  // 4 KiB streams reached it, on an Intel Xeon VM; F16 now streams each panel whole, Rows).
  // A span is the NS x sub x 32 bytes summed here; each column step
  // prefetches its share of the span two spans ahead (the panel's later columns, its scales,
  // the next panel), NS x 32 bytes rounded up to a line (so the 1-sub-block tail fetches
  // more than it needs). Measured in docs/QUANTIZATION.md (an Intel Xeon VM, where F16 lost
  // speed with it). Prefetches never fault: no effect but on timing.
  // F16, BF16 with 2-3 rows (one stream, NS = 1): each column prefetches the line
  // kStreamPrefetchBytes ahead, as the 4-12-row passes do (StreamsPanels): 1.1-1.6x faster
  // from memory on the AMD EPYC VM (bench/README.md, "Whole panels for small batches"). One
  // row (batch-1 decode) gained nothing or lost a little, F32 gained nothing: neither has it.
  constexpr int kPrefetchLines = WT == kWeightI8 ? (NS * kPanel + 63) / 64 : 0;
  constexpr bool kPrefetchStream = (WT == kWeightF16 || WT == kWeightBF16) && MR >= 2;
  const char* ahead = static_cast<const char*>(panel) + (k0 + 2 * NS * sub) * kPanel;
  for (int64_t k = k0; k < k0 + len; ++k) {
    if constexpr (kPrefetchStream) PrefetchColumn<WT>(panel, k, kStreamPrefetchBytes);
#pragma GCC unroll 4
    for (int j = 0; j < kPrefetchLines; ++j) {
      _mm_prefetch(ahead + ((k - k0) * kPrefetchLines + j) * 64, _MM_HINT_T0);
    }
#pragma GCC unroll 4
    for (int c = 0; c < NS; ++c) {
      __m512 w0, w1;
      LoadColumn<WT>(panel, k + c * sub, &w0, &w1);
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) {
        const __m512 b = _mm512_set1_ps(x[r * ldx + k + c * sub]);
        a0[c][r] = _mm512_fmadd_ps(b, w0, a0[c][r]);
        a1[c][r] = _mm512_fmadd_ps(b, w1, a1[c][r]);
      }
    }
  }
#pragma GCC unroll 4
  for (int c = 0; c < NS; ++c) {
    const uint16_t* s = WT == kWeightI8 ? scales + ((k0 + c * sub) / group) * kPanel : nullptr;
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) AddSubBlock<WT>(a0[c][r], a1[c][r], s, &y0[r], &y1[r]);
  }
}

// y[MR, valid outputs of panel p] = x[MR, in] * panel^T (+ bias) for 1-3 rows (row stride
// ldx, ldy), in the arithmetic of Block (same bits), the panel streamed once.
// F32, F16, BF16: the sub-blocks one after the other, so the panel is one sequential stream
// (2 FMA chains per row). Interleaving kRowChains / MR of them (8 chains or more, against
// the FMA latency) made as many streams 4 KiB apart (8 KiB for F32), which this AMD EPYC's
// prefetchers serve worse than one: batch-1 decode of the 261M model 1.08-1.22x faster with one
// stream, a 3-row verify step 1.24-1.27x -> 1.08-1.09x a plain step (bench/README.md,
// "One stream per panel"); the interleaving had been measured on an Intel Xeon VM.
// int8: kRowChains / MR sub-blocks (at least 2) interleaved, with software prefetch
// (RowChains; docs/QUANTIZATION.md).
template <int MR, int WT>
DCF_AVX512 void Rows(const float* x, int64_t ldx, const void* panel, int64_t in,
                     const uint16_t* scales, int64_t group, const float* bias, float* y,
                     int64_t ldy, int valid) {
  constexpr int kNS = WT != kWeightI8 ? 1 : (kRowChains / MR > 1 ? kRowChains / MR : 2);
  __mmask16 m0, m1;
  __m512 y0[MR], y1[MR];
  StartRows<MR>(bias, valid, &m0, &m1, y0, y1);
  const int64_t sub = SubBlock<WT>(group);
  int64_t k0 = 0;
  for (; k0 + kNS * sub <= in; k0 += kNS * sub) {
    RowChains<MR, kNS, WT>(x, ldx, panel, scales, group, sub, k0, sub, y0, y1);
  }
  for (; k0 < in; k0 += sub) {  // int8: the last sub-blocks one at a time; else a partial one
    RowChains<MR, 1, WT>(x, ldx, panel, scales, group, sub, k0, in - k0 < sub ? in - k0 : sub,
                         y0, y1);
  }
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {
    _mm512_mask_storeu_ps(y + r * ldy, m0, y0[r]);
    _mm512_mask_storeu_ps(y + r * ldy + 16, m1, y1[r]);
  }
}

// Rows [r0, r1) in passes of at most kRowsPerPass, the remainder split evenly (16 -> 8 + 8,
// not 12 + 4): pass i is rows [row[i], row[i] + n[i]). Returns the number of passes.
int SplitPasses(int64_t r0, int64_t r1, int64_t* row, int64_t* n) {
  int passes = 0;
  for (int64_t r = r0; r < r1;) {
    const int64_t left = r1 - r;
    const int64_t split = (left + kRowsPerPass - 1) / kRowsPerPass;
    row[passes] = r;
    n[passes] = (left + split - 1) / split;
    r += n[passes++];
  }
  return passes;
}

// The valid outputs of a panel for n rows: y (row stride ldy) into a tile [n, kPanel], and
// back.
DCF_AVX512_INLINE void LoadTile(const float* y, int64_t ldy, int n, int valid, float* tile) {
  __mmask16 m0, m1;
  ValidMasks(valid, &m0, &m1);
  for (int r = 0; r < n; ++r) {
    _mm512_store_ps(tile + r * kPanel, _mm512_maskz_loadu_ps(m0, y + r * ldy));
    _mm512_store_ps(tile + r * kPanel + 16, _mm512_maskz_loadu_ps(m1, y + r * ldy + 16));
  }
}
DCF_AVX512_INLINE void StoreTile(const float* tile, int n, int valid, float* y, int64_t ldy) {
  __mmask16 m0, m1;
  ValidMasks(valid, &m0, &m1);
  for (int r = 0; r < n; ++r) {
    _mm512_mask_storeu_ps(y + r * ldy, m0, _mm512_load_ps(tile + r * kPanel));
    _mm512_mask_storeu_ps(y + r * ldy + 16, m1, _mm512_load_ps(tile + r * kPanel + 16));
  }
}

// A row block's rows of y for the first and the last panel of a chunk of column-blocked
// panels (Panels), one per thread, allocated at its first such product: a thread_local array
// would be reserved in every thread of the process, product or not.
struct alignas(64) EdgeTiles {
  float rows[2][kRowBlock * kPanel];
};
EdgeTiles* ThreadEdgeTiles() {
  thread_local std::unique_ptr<EdgeTiles> tiles;
  if (tiles == nullptr) tiles = std::make_unique<EdgeTiles>();
  return tiles.get();
}

// How Panels cuts a product into tiles, and PackRowsAvx512 packs x for it: a product that
// StreamsPanels is one tile of every row and every column, a larger one row blocks of
// kRowBlock rows by column blocks of kColumnBlock columns.
struct Tiling {
  bool whole;
  int64_t row_block, column_block;
};
Tiling TilingOf(const PanelArgs& a) {
  const bool whole = StreamsPanels(a.rows, a.in);
  return {whole, whole ? a.rows : kRowBlock, whole ? a.in : kColumnBlock};
}

// Where the tile of rows [r0, r1) (a row block) and columns from k0 (a column block) starts
// in x packed whole (PanelArgs::xpacked): the row blocks one after another, within one its
// column blocks, each holding the block's rows x its columns.
int64_t PackedTileOffset(const PanelArgs& a, int64_t r0, int64_t r1, int64_t k0) {
  return r0 * a.in + (r1 - r0) * k0;
}

// Columns [k0, k0 + kc) of each pass's rows of x, interleaved k-major ([kc][n], the passes one
// after another) into dst: the broadcasts of one column come from one cache line, not from n
// rows 4 KiB apart (which share an L1 set).
void PackPasses(const float* x, int64_t ldx, int passes, const int64_t* row, const int64_t* n,
                int64_t k0, int64_t kc, float* dst) {
  for (int g = 0; g < passes; ++g) {
    for (int64_t j = 0; j < n[g]; ++j) {
      const float* src = x + (row[g] + j) * ldx + k0;
      for (int64_t k = 0; k < kc; ++k) dst[k * n[g] + j] = src[k];
    }
    dst += n[g] * kc;
  }
}

template <int WT>
DCF_AVX512 void BlockAnyRows(int rows, const float* x, int64_t xr, int64_t xk, const void* panel,
                             int64_t in, const uint16_t* scales, int64_t group,
                             const float* bias, bool accumulate, float* y, int64_t ldy,
                             int valid, int64_t prefetch) {
  switch (rows) {
#define DCF_CASE(n)                                                                            \
  case n:                                                                                      \
    Block<n, WT>(x, xr, xk, panel, in, scales, group, bias, accumulate, y, ldy, valid,         \
                 prefetch);                                                                    \
    break;
    DCF_CASE(1) DCF_CASE(2) DCF_CASE(3) DCF_CASE(4) DCF_CASE(5) DCF_CASE(6)
    DCF_CASE(7) DCF_CASE(8) DCF_CASE(9) DCF_CASE(10) DCF_CASE(11) DCF_CASE(12)
#undef DCF_CASE
    default: break;
  }
}

// Every row count follows the summation rule of matmul_kernels.h (sub-blocks summed from
// zero, added to y in order), so each row's arithmetic is the same in a batch of 1 or of 200.
// 1-3 rows (decode of a few sequences): each panel streamed once by Rows (int8: its
// sub-blocks interleaved; F32, F16, BF16: one after the other). More rows, x packed k-major
// (the broadcasts of a column from one line) and every panel passed over by Block in passes
// of up to kRowsPerPass rows: small products (StreamsPanels: a verify step, a few decodes)
// pack all of x and pass over whole panels, each one sequential stream with prefetch; large
// ones are blocked GotoBLAS-style, kRowBlock rows by kColumnBlock columns of x packed (in
// L2) while every panel's slice of those columns passes over them (the weights are streamed
// rows / kRowBlock times).
template <int WT>
DCF_AVX512 void Panels(const PanelArgs& a, int64_t p0, int64_t p1) {
  const int64_t elem = WT == kWeightF32 ? 4 : WT == kWeightI8 ? 1 : 2;
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  // Bytes of a panel; int8 ones end with their scales [groups, 32] bf16.
  const int64_t panel_bytes = PanelBytes(static_cast<WeightType>(WT), a.in, a.group);
  // Columns [k0, ...) of panel p, and (int8) their scales from k0's group on.
  const auto panel_at = [&](int64_t p, int64_t k0) -> const void* {
    return w + p * panel_bytes + k0 * kPanel * elem;
  };
  const auto scales_at = [&](int64_t p, int64_t k0) -> const uint16_t* {
    if constexpr (WT != kWeightI8) return nullptr;
    return reinterpret_cast<const uint16_t*>(w + p * panel_bytes + a.in * kPanel) +
           (k0 / a.group) * kPanel;
  };
  if (a.rows <= 3) {
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t o = p * kPanel;
      const int valid = static_cast<int>(a.out - o < kPanel ? a.out - o : kPanel);
      const float* bias = a.bias != nullptr ? a.bias + o : nullptr;
      const void* panel = panel_at(p, 0);
      const uint16_t* scales = scales_at(p, 0);
      float* y = a.y + o;
      switch (a.rows) {
        case 1: Rows<1, WT>(a.x, a.ldx, panel, a.in, scales, a.group, bias, y, a.ldy, valid); break;
        case 2: Rows<2, WT>(a.x, a.ldx, panel, a.in, scales, a.group, bias, y, a.ldy, valid); break;
        default: Rows<3, WT>(a.x, a.ldx, panel, a.in, scales, a.group, bias, y, a.ldy, valid);
      }
    }
    return;
  }
  // x packed already (MatMul packs a product once for all its chunks: PackRowsAvx512),
  // packed here, or read in place.
  const bool prepacked = a.xpacked != nullptr;
  const bool pack = prepacked || a.xpack != nullptr;
  // Small products stream whole panels (StreamsPanels): one row block of every row and one
  // column block of every column, with prefetch; large ones are blocked.
  const auto [whole, row_block, column_block] = TilingOf(a);
  const int64_t prefetch = whole ? kStreamPrefetchBytes : 0;
  alignas(64) float tile[kRowsPerPass * kPanel];  // a pass's rows of y for one panel
  // Column blocks: a row block's rows of y for the first and the last panel of the chunk.
  EdgeTiles* const edge = whole ? nullptr : ThreadEdgeTiles();
  for (int64_t r0 = 0; r0 < a.rows; r0 += row_block) {
    const int64_t r1 = r0 + row_block < a.rows ? r0 + row_block : a.rows;
    int64_t pass_row[kRowBlock], pass_n[kRowBlock];
    const int passes = SplitPasses(r0, r1, pass_row, pass_n);
    for (int64_t k0 = 0; k0 < a.in; k0 += column_block) {
      const int64_t kc = a.in - k0 < column_block ? a.in - k0 : column_block;
      if (pack && !prepacked) PackPasses(a.x, a.ldx, passes, pass_row, pass_n, k0, kc, a.xpack);
      for (int64_t p = p0; p < p1; ++p) {
        const void* panel = panel_at(p, k0);
        const uint16_t* scales = scales_at(p, k0);
        const int64_t o = p * kPanel;
        const int valid = static_cast<int>(a.out - o < kPanel ? a.out - o : kPanel);
        const float* bias = a.bias != nullptr && k0 == 0 ? a.bias + o : nullptr;
        const float* packed = prepacked ? a.xpacked + PackedTileOffset(a, r0, r1, k0) : a.xpack;
        // Block adds to y once per sub-block, so it works on line-aligned copies of y here,
        // which reach y once: on y itself, the lines that a panel at the edge of the chunk
        // shares with a neighbouring chunk's (unless y's rows start on a line) bounced between
        // the cores running them (2-thread products of 12-128 rows 1.17-1.33x slower than
        // with an aligned y), and stores straddled two lines. A pass's rows go through `tile`; with
        // column blocks the chunk's edge panels instead sum in `edge` over all of them.
        float* const edge_rows = whole ? nullptr
                                 : p == p0 ? edge->rows[0]
                                 : p == p1 - 1 ? edge->rows[1]
                                 : nullptr;
        for (int g = 0; g < passes; ++g) {
          const int64_t r = pass_row[g], n = pass_n[g];
          float* y = a.y + r * a.ldy + o;
          float* acc = edge_rows != nullptr ? edge_rows + (r - r0) * kPanel : tile;
          if (k0 > 0 && edge_rows == nullptr) LoadTile(y, a.ldy, static_cast<int>(n), valid, tile);
          if (pack) {
            BlockAnyRows<WT>(static_cast<int>(n), packed, 1, n, panel, kc, scales, a.group,
                             bias, k0 > 0, acc, kPanel, valid, prefetch);
            packed += n * kc;
          } else {
            BlockAnyRows<WT>(static_cast<int>(n), a.x + r * a.ldx + k0, a.ldx, 1, panel, kc,
                             scales, a.group, bias, k0 > 0, acc, kPanel, valid, prefetch);
          }
          if (edge_rows == nullptr || k0 + kc == a.in) {
            StoreTile(acc, static_cast<int>(n), valid, y, a.ldy);
          }
        }
      }
    }
  }
}

// int8 x int8 (kWeightI8A8, layout and arithmetic in matmul_kernels.h). One group block of
// one panel for MR rows (xq: row 0's quantized x at the group's first column, row stride
// ldxq): the integer sums s0, s1 (outputs 0-15, 16-31) of (x_q + 128) * q, vpdpbusd adding
// four columns per lane. The group's 4-column steps are spread over NC accumulator sets
// (integer sums: any split gives the same result), so 1-2 rows still have 8 chains.
template <int MR, int NC>
DCF_VNNI_INLINE void GroupSums(const uint8_t* xq, int64_t ldxq, const int8_t* q, int64_t steps,
                               __m512i* s0, __m512i* s1) {
  __m512i a0[NC][MR], a1[NC][MR];
#pragma GCC unroll 4
  for (int c = 0; c < NC; ++c) {
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) a0[c][r] = a1[c][r] = _mm512_setzero_si512();
  }
  int64_t s = 0;
  for (; s + NC <= steps; s += NC) {
#pragma GCC unroll 4
    for (int c = 0; c < NC; ++c) {
      const __m512i w0 = _mm512_loadu_si512(q + (s + c) * 128);
      const __m512i w1 = _mm512_loadu_si512(q + (s + c) * 128 + 64);
#pragma GCC unroll 4
      for (int r = 0; r < MR; ++r) {
        int32_t four;
        __builtin_memcpy(&four, xq + r * ldxq + (s + c) * 4, 4);
        const __m512i b = _mm512_set1_epi32(four);
        a0[c][r] = _mm512_dpbusd_epi32(a0[c][r], b, w0);
        a1[c][r] = _mm512_dpbusd_epi32(a1[c][r], b, w1);
      }
    }
  }
  for (; s < steps; ++s) {
    const __m512i w0 = _mm512_loadu_si512(q + s * 128);
    const __m512i w1 = _mm512_loadu_si512(q + s * 128 + 64);
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      int32_t four;
      __builtin_memcpy(&four, xq + r * ldxq + s * 4, 4);
      const __m512i b = _mm512_set1_epi32(four);
      a0[0][r] = _mm512_dpbusd_epi32(a0[0][r], b, w0);
      a1[0][r] = _mm512_dpbusd_epi32(a1[0][r], b, w1);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {
    s0[r] = a0[0][r];
    s1[r] = a1[0][r];
#pragma GCC unroll 4
    for (int c = 1; c < NC; ++c) {
      s0[r] = _mm512_add_epi32(s0[r], a0[c][r]);
      s1[r] = _mm512_add_epi32(s1[r], a1[c][r]);
    }
  }
}

// A group block's 32 scales (outputs 0-15, 16-31) and 128 x its sums of q (c0, c1), which
// every row's integer sums of (x_q + 128) * q subtract.
DCF_AVX512_INLINE void GroupScales(const uint8_t* block, int64_t len, __m512* sc0, __m512* sc1,
                                   __m512i* c0, __m512i* c1) {
  LoadScales(reinterpret_cast<const uint16_t*>(block + I8A8ScalesOffset(len)), sc0, sc1);
  const __m512i qsum = _mm512_loadu_si512(block + I8A8SumsOffset(len));
  *c0 = _mm512_slli_epi32(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(qsum)), 7);
  *c1 = _mm512_slli_epi32(_mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(qsum, 1)), 7);
}

// One group's term of 16 outputs of a row: fma(float(s - c), x_scale * w_scale, y).
DCF_AVX512_INLINE __m512 AddGroup(__m512i s, __m512i c, __m512 xscale, __m512 sc, __m512 y) {
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(s, c)), _mm512_mul_ps(xscale, sc),
                         y);
}

// y[MR rows, valid outputs of one panel] for MR <= 4 rows of quantized x (row r at
// xq + r * ldxq, scales at xs + r * ldxs): every group's sums, corrected by 128 * qsum and
// added to y as fma(float(S), x_scale * w_scale, y), groups in order.
template <int MR>
DCF_VNNI void RowsI8A8(const uint8_t* xq, int64_t ldxq, const float* xs, int64_t ldxs,
                       const uint8_t* panel, int64_t in, int64_t group, const float* bias,
                       float* y, int64_t ldy, int valid) {
  constexpr int kNC = MR == 1 ? 4 : MR == 2 ? 2 : 1;
  __mmask16 m0, m1;
  __m512 y0[MR], y1[MR];
  StartRows<MR>(bias, valid, &m0, &m1, y0, y1);
  const uint8_t* block = panel;
  for (int64_t g = 0, k0 = 0; k0 < in; ++g, k0 += group) {
    const int64_t len = in - k0 < group ? in - k0 : group;
    __m512i s0[MR], s1[MR];
    GroupSums<MR, kNC>(xq + k0, ldxq, reinterpret_cast<const int8_t*>(block), I8A8Steps(len),
                       s0, s1);
    __m512 sc0, sc1;
    __m512i c0, c1;
    GroupScales(block, len, &sc0, &sc1, &c0, &c1);
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r) {
      const __m512 xscale = _mm512_set1_ps(xs[r * ldxs + g]);
      y0[r] = AddGroup(s0[r], c0, xscale, sc0, y0[r]);
      y1[r] = AddGroup(s1[r], c1, xscale, sc1, y1[r]);
    }
    block += I8A8BlockBytes(len);
  }
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r) {
    _mm512_mask_storeu_ps(y + r * ldy, m0, y0[r]);
    _mm512_mask_storeu_ps(y + r * ldy + 16, m1, y1[r]);
  }
}

// *acc += the four u8 x s8 products of each 32-bit lane of x and w (_mm512_dpbusd_epi32, the
// accumulator updated in place): with the intrinsic, GCC 12 copies every accumulator between
// two registers each step, and with 24 of them (12 rows) stores them to the stack as well.
DCF_VNNI_INLINE void DpBusd(__m512i* acc, __m512i x, __m512i w) {
  __asm__("vpdpbusd %2, %1, %0" : "+v"(*acc) : "v"(x), "v"(w));
}

// RowsI8A8 for 5-12 rows: a group's integer sums take 2 MR accumulators (24 of the 32
// vector registers at 12 rows: two weight loads and MR broadcasts feed 2 MR vpdpbusd a
// 4-column step, where 4 rows gave 8 for 6 loads), so y waits between groups in an L1
// buffer instead of registers. The same operations on the same values in the same order as
// RowsI8A8: the same bits.
template <int MR, bool kPrefetch>
DCF_VNNI void RowsI8A8Wide(const uint8_t* xq, int64_t ldxq, const float* xs, int64_t ldxs,
                           const uint8_t* panel, int64_t in, int64_t group, const float* bias,
                           float* y, int64_t ldy, int valid, const uint8_t* next) {
  alignas(64) float acc[MR][kPanel];  // y of the MR rows' 32 outputs between groups
  __mmask16 m0, m1;
  ValidMasks(valid, &m0, &m1);
  const __m512 b0 = bias != nullptr ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();
  const __m512 b1 = bias != nullptr ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();
  for (int r = 0; r < MR; ++r) {
    _mm512_store_ps(acc[r], b0);
    _mm512_store_ps(acc[r] + 16, b1);
  }
  const uint8_t* block = panel;
  for (int64_t g = 0, k0 = 0; k0 < in; ++g, k0 += group) {
    const int64_t len = in - k0 < group ? in - k0 : group;
    __m512i s0[MR], s1[MR];
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) s0[r] = s1[r] = _mm512_setzero_si512();
    const int8_t* q = reinterpret_cast<const int8_t*>(block);
    const int64_t steps = I8A8Steps(len);
    const uint8_t* pf = next + (block - panel);
    for (int64_t s = 0; s < steps; ++s) {
      if constexpr (kPrefetch) {
        _mm_prefetch(reinterpret_cast<const char*>(pf + s * 128), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(pf + s * 128 + 64), _MM_HINT_T0);
      }
      const __m512i w0 = _mm512_loadu_si512(q + s * 128);
      const __m512i w1 = _mm512_loadu_si512(q + s * 128 + 64);
#pragma GCC unroll 16
      for (int r = 0; r < MR; ++r) {
        int32_t four;
        __builtin_memcpy(&four, xq + k0 + r * ldxq + s * 4, 4);
        const __m512i b = _mm512_set1_epi32(four);
        DpBusd(&s0[r], b, w0);
        DpBusd(&s1[r], b, w1);
      }
    }
    if constexpr (kPrefetch) {
      _mm_prefetch(reinterpret_cast<const char*>(pf + I8A8ScalesOffset(len)), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(pf + I8A8SumsOffset(len)), _MM_HINT_T0);
    }
    __m512 sc0, sc1;
    __m512i c0, c1;
    GroupScales(block, len, &sc0, &sc1, &c0, &c1);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const __m512 xscale = _mm512_set1_ps(xs[r * ldxs + g]);
      _mm512_store_ps(acc[r], AddGroup(s0[r], c0, xscale, sc0, _mm512_load_ps(acc[r])));
      _mm512_store_ps(acc[r] + 16, AddGroup(s1[r], c1, xscale, sc1, _mm512_load_ps(acc[r] + 16)));
    }
    block += I8A8BlockBytes(len);
  }
  for (int r = 0; r < MR; ++r) {
    _mm512_mask_storeu_ps(y + r * ldy, m0, _mm512_load_ps(acc[r]));
    _mm512_mask_storeu_ps(y + r * ldy + 16, m1, _mm512_load_ps(acc[r] + 16));
  }
}

// Every panel, rows in passes of at most kI8A8RowsPerPass (the remainder split evenly: 29 ->
// 10 + 10 + 9); a panel (its q, scales and sums) is read from memory once and from cache by
// later passes. At 29 rows passes of 12 rather than 4 took the 261M shape's products
// 0.9-1.4x (the 1,024 x 1,024 matrix: 0.9-1.1x) and its output matrix 1.6-1.7x faster
// (docs/QUANTIZATION.md, "Passes of 12 rows").
DCF_VNNI void PanelsI8A8(const PanelArgs& a, int64_t p0, int64_t p1) {
  constexpr int kMaxRows = kI8A8RowsPerPass;
  static_assert(kMaxRows == 12, "the switch below has cases for 1-12 rows");
  const uint8_t* w = static_cast<const uint8_t*>(a.w);
  const int64_t panel_bytes = I8A8PanelBytes(a.in, a.group);
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t o = p * kPanel;
    const int valid = static_cast<int>(a.out - o < kPanel ? a.out - o : kPanel);
    const float* bias = a.bias != nullptr ? a.bias + o : nullptr;
    const uint8_t* panel = w + p * panel_bytes;
    for (int64_t r = 0; r < a.rows;) {
      const int64_t left = a.rows - r;
      const int64_t passes = (left + kMaxRows - 1) / kMaxRows;
      const int64_t n = (left + passes - 1) / passes;
      const uint8_t* xq = a.xq + r * a.ldxq;
      const float* xs = a.xs + r * a.ldxs;
      float* y = a.y + r * a.ldy + o;
      // With 5 rows or more, the first pass over a panel asks for the next one (this
      // thread's, p + 1 < p1) as it reads its own, so this pass's arithmetic (and the
      // later passes', past 12 rows) hides the next panel's fetch; 1-4 rows stream the
      // panels with the hardware's prefetch alone.
      const uint8_t* next = r == 0 && p + 1 < p1 ? panel + panel_bytes : nullptr;
      switch (n) {
#define DCF_ROWS(m) \
  RowsI8A8<m>(xq, a.ldxq, xs, a.ldxs, panel, a.in, a.group, bias, y, a.ldy, valid)
        case 1: DCF_ROWS(1); break;
        case 2: DCF_ROWS(2); break;
        case 3: DCF_ROWS(3); break;
        case 4: DCF_ROWS(4); break;
#undef DCF_ROWS
#define DCF_WIDE(m)                                                                         \
  if (next != nullptr) {                                                                    \
    RowsI8A8Wide<m, true>(xq, a.ldxq, xs, a.ldxs, panel, a.in, a.group, bias, y, a.ldy, valid, \
                          next);                                                            \
  } else {                                                                                  \
    RowsI8A8Wide<m, false>(xq, a.ldxq, xs, a.ldxs, panel, a.in, a.group, bias, y, a.ldy,       \
                           valid, panel);                                                   \
  }
        case 5: DCF_WIDE(5); break;
        case 6: DCF_WIDE(6); break;
        case 7: DCF_WIDE(7); break;
        case 8: DCF_WIDE(8); break;
        case 9: DCF_WIDE(9); break;
        case 10: DCF_WIDE(10); break;
        case 11: DCF_WIDE(11); break;
        default: DCF_WIDE(12);
#undef DCF_WIDE
      }
      r += n;
    }
  }
}

}  // namespace

// QuantizeActivationRowInt8 16 lanes at a time: the same operations on the same values
// (max |x| over the group's non-NaN elements, one IEEE multiply or divide, the clamp, the
// round-half-even additions), so the same bits; the partial last group through masked
// loads (0 in the lanes past n, which no max changes) and stores.
DCF_AVX512 void QuantizeActivationRowInt8Avx512(const float* x, int64_t n, int group,
                                                uint8_t* u, float* scales) {
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23, as the scalar rule
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int64_t g = 0, k0 = 0; k0 < n; ++g, k0 += group) {
    const int64_t len = n - k0 < group ? n - k0 : group;
    __m512 mx = _mm512_setzero_ps();
    __mmask16 nan = 0;
    for (int64_t k = 0; k < len; k += 16) {
      const __mmask16 m = TailMask(static_cast<int>(len - k));  // len <= group <= 128
      const __m512 v = _mm512_maskz_loadu_ps(m, x + k0 + k);
      const __mmask16 ord = _mm512_cmp_ps_mask(v, v, _CMP_ORD_Q);
      nan |= static_cast<__mmask16>(~ord & m);
      mx = _mm512_mask_max_ps(mx, ord, mx, _mm512_andnot_ps(sign, v));
    }
    const float absmax = _mm512_reduce_max_ps(mx);
    scales[g] = nan != 0 ? std::numeric_limits<float>::quiet_NaN() : absmax / 127.0f;
    const float inv = absmax > 0 ? 127.0f / absmax : 0.0f;
    const bool tiny = inv > std::numeric_limits<float>::max();
    const __m512 vinv = _mm512_set1_ps(inv), vmax = _mm512_set1_ps(absmax);
    for (int64_t k = 0; k < len; k += 16) {
      const __mmask16 m = TailMask(static_cast<int>(len - k));  // len <= group <= 128
      const __m512 v = _mm512_maskz_loadu_ps(m, x + k0 + k);
      const __m512 t = tiny ? _mm512_mul_ps(_mm512_div_ps(v, vmax), _mm512_set1_ps(127.0f))
                            : _mm512_mul_ps(v, vinv);
      __m512 c = _mm512_mask_mov_ps(t, _mm512_cmp_ps_mask(t, _mm512_set1_ps(127.0f), _CMP_GT_OQ),
                                    _mm512_set1_ps(127.0f));
      c = _mm512_mask_mov_ps(c, _mm512_cmp_ps_mask(c, _mm512_set1_ps(-127.0f), _CMP_LT_OQ),
                             _mm512_set1_ps(-127.0f));
      const __m512 r = _mm512_sub_ps(_mm512_add_ps(c, _mm512_set1_ps(kRound)),
                                     _mm512_set1_ps(kRound));
      // NaN (a NaN x, or an infinite one: inf * 0) becomes 0; the scale carries it.
      const __m512i q = _mm512_maskz_cvttps_epi32(_mm512_cmp_ps_mask(r, r, _CMP_ORD_Q), r);
      _mm_mask_storeu_epi8(u + k0 + k, m,
                           _mm512_cvtepi32_epi8(_mm512_add_epi32(q, _mm512_set1_epi32(128))));
    }
  }
  for (int64_t k = n; k < RoundUpTo4(n); ++k) u[k] = 128;
}

void PackRowsAvx512(const PanelArgs& a, float* dst, int part, int parts) {
  // The tiles (row block x column block) one after another, as Panels walks them; within a
  // tile its passes one after another. A unit is one pass of one tile.
  const auto [whole, row_block, column_block] = TilingOf(a);
  int64_t unit = 0;
  for (int64_t r0 = 0; r0 < a.rows; r0 += row_block) {
    const int64_t r1 = r0 + row_block < a.rows ? r0 + row_block : a.rows;
    int64_t row[kRowBlock], n[kRowBlock];
    const int passes = SplitPasses(r0, r1, row, n);
    for (int64_t k0 = 0; k0 < a.in; k0 += column_block) {
      const int64_t kc = a.in - k0 < column_block ? a.in - k0 : column_block;
      float* tile = dst + PackedTileOffset(a, r0, r1, k0);
      for (int g = 0; g < passes; ++g, ++unit) {
        if (unit % parts == part) PackPasses(a.x, a.ldx, 1, &row[g], &n[g], k0, kc, tile);
        tile += n[g] * kc;
      }
    }
  }
}

DCF_AVX512 void PanelsAvx512(const PanelArgs& a, int64_t panel_begin, int64_t panel_end) {
  switch (a.weight_type) {
    case kWeightF32: Panels<kWeightF32>(a, panel_begin, panel_end); break;
    case kWeightF16: Panels<kWeightF16>(a, panel_begin, panel_end); break;
    case kWeightBF16: Panels<kWeightBF16>(a, panel_begin, panel_end); break;
    case kWeightI8: Panels<kWeightI8>(a, panel_begin, panel_end); break;
    case kWeightI8A8:
      // Called directly on a CPU without VNNI (MatMul never does), the same bits from AVX2.
      if (HasAvx512Vnni()) {
        PanelsI8A8(a, panel_begin, panel_end);
      } else {
        PanelsAvx2(a, panel_begin, panel_end);
      }
      break;
    default: break;
  }
}

}  // namespace dcf::cpu::kernels
