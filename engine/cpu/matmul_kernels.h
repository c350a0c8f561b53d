// The per-ISA kernels behind cpu::MatMul (packed_matrix.h), one set per instruction-set
// level. Internal to engine/cpu; callers use MatMul.
//
// Each kernel computes y for the output panels [panel_begin, panel_end) of a packed matrix
// and every row of x, single-threaded. ISA-specific code carries function target attributes
// (never file-wide -m flags), so no shared inline code is compiled with instructions the CPU
// may lack; cpu_isa.h decides which kernel may run.
#pragma once

#include <cstdint>

namespace dcf::cpu::kernels {

// Outputs per panel (packed_matrix.h).
inline constexpr int kPanelOutputs = 32;

// Weight storage of a packed matrix (mirrors DType without including it).
// kWeightI8: int8 panels followed by their bf16 group scales (packed_matrix.h); G divides
// kColumnBlock and is 32 or a multiple of kSubBlock.
// kWeightI8A8: int8 weights for int8 x int8 products (layout below), x quantized per row
// and group by MatMul before the kernel runs (PanelArgs::xq, xs).
enum WeightType : int {
  kWeightF32 = 0,
  kWeightF16 = 1,
  kWeightBF16 = 2,
  kWeightI8 = 3,
  kWeightI8A8 = 4
};

// kWeightI8A8 panels: one block per group g of G columns (the last may be partial, len
// columns), one after the other, so a panel is one sequential stream:
//   q     [ceil(len / 4)][32][4] int8: q[s][j][b] = W[32 p + j][g G + 4 s + b] (0 past `in`),
//         the four columns of each output VNNI's vpdpbusd multiplies and adds into one lane
//   scale [32] bf16, the group's weight scales
//   qsum  [32] int16, sum over the group of q (<= 128 * 128 in magnitude: a checkpoint may
//         hold -128), which turns the sum of (x_q + 128) * q that vpdpbusd computes back
//         into the sum of x_q * q
// Arithmetic, the same in every kernel and for every row count (so all kernels give the same
// bits, and a row's bits never depend on the batch): y = bias (or 0), then for each group in
// order y = fma(float(S), x_scale * w_scale, y), S the group's exact integer sum of x_q * q
// (|S| <= 127 * 128 * 128 < 2^24, so float(S) is exact).
// The addressing, used by the packer, PackedMatrix's accessors and every kernel: byte
// offsets in a block of `len` columns (the q of output j at column c of the group; the
// scales; the sums), and of group g's block in a panel (every block before it is whole).
inline constexpr int64_t I8A8Steps(int64_t len) { return (len + 3) / 4; }
inline constexpr int64_t I8A8QOffset(int64_t c, int j) { return c / 4 * 128 + j * 4 + c % 4; }
inline constexpr int64_t I8A8ScalesOffset(int64_t len) { return I8A8Steps(len) * 128; }
inline constexpr int64_t I8A8SumsOffset(int64_t len) { return I8A8ScalesOffset(len) + 64; }
inline constexpr int64_t I8A8BlockBytes(int64_t len) { return I8A8ScalesOffset(len) + 128; }
inline constexpr int64_t I8A8BlockOffset(int64_t g, int64_t group) {
  return g * I8A8BlockBytes(group);
}
inline constexpr int64_t I8A8PanelBytes(int64_t in, int64_t group) {
  return in / group * I8A8BlockBytes(group) + (in % group != 0 ? I8A8BlockBytes(in % group) : 0);
}

// Bytes of one panel of `in` columns (`group`: the int8 types' columns per scale).
inline constexpr int64_t PanelBytes(WeightType type, int64_t in, int64_t group) {
  switch (type) {
    case kWeightF32: return int64_t{kPanelOutputs} * in * 4;
    case kWeightF16:
    case kWeightBF16: return int64_t{kPanelOutputs} * in * 2;
    case kWeightI8: return int64_t{kPanelOutputs} * (in + 2 * ((in + group - 1) / group));
    case kWeightI8A8: return I8A8PanelBytes(in, group);
  }
  return 0;
}

struct PanelArgs {
  const float* x = nullptr;  // [rows, in], row stride ldx
  int64_t ldx = 0;
  int64_t rows = 0;
  const void* w = nullptr;  // packed [num_panels, in, 32] (+ scales for int8)
  int weight_type = kWeightF32;
  int64_t group = 0;  // kWeightI8, kWeightI8A8: columns per scale (a divisor of kColumnBlock)
  int64_t in = 0;
  int64_t out = 0;
  const float* bias = nullptr;  // [out] or null
  float* y = nullptr;           // [rows, out], row stride ldy
  int64_t ldy = 0;
  // Scratch of PackFloats(rows, in) floats the kernel may pack rows of x into (null: no
  // packing). Per thread: each call writes it.
  float* xpack = nullptr;
  // x packed by PackRowsAvx512 (a.rows x a.in floats), which the AVX-512 kernel then reads
  // instead of packing x into xpack on every call: MatMul packs once per product, not once
  // per chunk of panels a thread takes. Null: not packed. Shared by the threads.
  const float* xpacked = nullptr;
  // kWeightI8A8: x quantized by QuantizeActivationRowInt8 (engine/weights/int8_quant.h), row
  // r's q + 128 at xq + r * ldxq (ldxq >= in rounded up to 4) and its group scales at
  // xs + r * ldxs.
  const uint8_t* xq = nullptr;
  int64_t ldxq = 0;
  const float* xs = nullptr;
  int64_t ldxs = 0;
};

// kWeightI8A8 needs AVX-512 VNNI as well: without it PanelsAvx512 runs PanelsAvx2's.
void PanelsAvx512(const PanelArgs& a, int64_t panel_begin, int64_t panel_end);
// Packs a.x (a.rows x a.in, 4 or more rows) into dst (a.rows * a.in floats) as PanelsAvx512
// reads it, every tile (row block x column block; one tile when the product StreamsPanels)
// pass by pass, for PanelArgs::xpacked; `parts` threads pack it together, each calling this
// with its own `part` (0 .. parts - 1) before any of them runs the kernel. Plain C++: runs on
// any CPU.
void PackRowsAvx512(const PanelArgs& a, float* dst, int part = 0, int parts = 1);
void PanelsAvx2(const PanelArgs& a, int64_t panel_begin, int64_t panel_end);
// QuantizeActivationRowInt8 (engine/weights/int8_quant.h) with AVX-512: the same bits, for
// MatMul's int8 x int8 products on a CPU with AVX-512 (packed_matrix_test compares them).
void QuantizeActivationRowInt8Avx512(const float* x, int64_t n, int group, uint8_t* u,
                                     float* scales);
void PanelsPortable(const PanelArgs& a, int64_t panel_begin, int64_t panel_end);

// Rows of x one pass over a panel serves at most (the row block of each kernel), and for
// kWeightI8A8 (whose AVX-512 kernel keeps two accumulators per row and 4-column step: 24 of
// the 32 vector registers).
inline constexpr int kRowsPerPass = 12;
inline constexpr int kI8A8RowsPerPass = 12;
// The portable and AVX2 kernels (matmul_generic.cc): passes of kGenericRows rows (4 x 32
// accumulators fill the 16 AVX2 registers) over row blocks of kGenericRowBlock rows, kept hot
// while a thread's panels pass over them (48 * in floats).
inline constexpr int kGenericRows = 4;
inline constexpr int kGenericRowBlock = 48;
// Blocking of the AVX-512 kernel for large products (more rows than StreamsPanels allows):
// rows of x and columns (k) packed together (192 x 256 floats = 192 KiB, resident in L2 while
// every panel passes over them); the weights are streamed rows / kRowBlock times, each panel
// in pieces of kColumnBlock columns.
inline constexpr int kRowBlock = 192;
inline constexpr int kColumnBlock = 256;
// Summation rule of the AVX-512 kernel, the same for every row count so that a row's bits
// never depend on the batch: a row's columns are summed in sub-blocks of kSubBlock columns
// (int8: min(kSubBlock, G), inside one group), each from zero in column order, and the
// sub-block sums are added to y (first to the bias, or 0) in order; int8 sums are of
// x * q (q widened exactly) and are multiplied by their group's scales in that addition
// (one FMA per sub-block instead of a multiply per column). Passes of 4-12 rows have
// independent chains across rows. 1-3 rows read each panel as one sequential stream, a
// sub-block after the other (2 FMA chains a row; 2-3 rows of F16 and BF16 prefetch
// kStreamPrefetchBytes ahead); int8 weights instead interleave max(2, kRowChains / rows)
// sub-blocks, with software prefetch (matmul_avx512.cc, Rows).
inline constexpr int kSubBlock = 64;
inline constexpr int kRowChains = 4;
static_assert(kColumnBlock % kSubBlock == 0, "a column block holds whole sub-blocks");
// Floats of x packed together by the blocked kernel (kRowBlock x kColumnBlock).
inline constexpr int64_t kPackFloats = int64_t{kRowBlock} * kColumnBlock;

// Whether the AVX-512 kernel streams whole panels for a product of `rows` (4 or more) by
// `in`: all of x packed at once (one pass of up to kRowsPerPass rows, or one row block of at
// most kPackFloats floats: it stays in L2), then every pass reads a panel start to end, the
// first from memory as one sequential stream (a thread's panels are consecutive, so its whole
// share is one stream), the others from cache, prefetching kStreamPrefetchBytes ahead. The
// blocked path instead restarts the stream every kColumnBlock columns, which cost 4-12 rows
// 1.5-3x their time on the AMD EPYC VM (bench/README.md, "Whole panels for small batches").
inline constexpr bool StreamsPanels(int64_t rows, int64_t in) {
  return rows <= kRowsPerPass || (rows <= kRowBlock && rows * in <= kPackFloats);
}
inline constexpr int64_t kStreamPrefetchBytes = 8192;
// Floats of the per-thread pack buffer (PanelArgs::xpack) a product of `rows` x `in` needs.
inline constexpr int64_t PackFloats(int64_t rows, int64_t in) {
  return StreamsPanels(rows, in) && rows * in > kPackFloats ? rows * in : kPackFloats;
}

}  // namespace dcf::cpu::kernels
