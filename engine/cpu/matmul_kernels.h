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

// Weight storage of a packed matrix (mirrors DType without including it).
// kWeightI8: int8 panels followed by their bf16 group scales (packed_matrix.h); G divides
// kColumnBlock and is 32 or a multiple of kSubBlock.
enum WeightType : int { kWeightF32 = 0, kWeightF16 = 1, kWeightBF16 = 2, kWeightI8 = 3 };

struct PanelArgs {
  const float* x = nullptr;  // [rows, in], row stride ldx
  int64_t ldx = 0;
  int64_t rows = 0;
  const void* w = nullptr;  // packed [num_panels, in, 32] (+ scales for int8)
  int weight_type = kWeightF32;
  int64_t group = 0;  // kWeightI8: columns per scale (a divisor of kColumnBlock)
  int64_t in = 0;
  int64_t out = 0;
  const float* bias = nullptr;  // [out] or null
  float* y = nullptr;           // [rows, out], row stride ldy
  int64_t ldy = 0;
  // Scratch of kPackFloats floats the kernel may pack rows of x into (null: no packing).
  // Per thread: each call writes it.
  float* xpack = nullptr;
};

void PanelsAvx512(const PanelArgs& a, int64_t panel_begin, int64_t panel_end);
void PanelsAvx2(const PanelArgs& a, int64_t panel_begin, int64_t panel_end);
void PanelsPortable(const PanelArgs& a, int64_t panel_begin, int64_t panel_end);

// Rows of x one pass over a panel serves at most (the row block of each kernel).
inline constexpr int kRowsPerPass = 12;
// Blocking of the AVX-512 kernel for more than one row: rows of x and columns (k) packed
// together (192 x 256 floats = 192 KiB, resident in L2 while every panel passes over them).
inline constexpr int kRowBlock = 192;
inline constexpr int kColumnBlock = 256;
// Summation rule of the AVX-512 kernel, the same for every row count so that a row's bits
// never depend on the batch: a row's columns are summed in sub-blocks of kSubBlock columns
// (int8: min(kSubBlock, G), inside one group), each from zero in column order, and the
// sub-block sums are added to y (first to the bias, or 0) in order; int8 sums are of
// x * q (q widened exactly) and are multiplied by their group's scales in that addition
// (one FMA per sub-block instead of a multiply per column). Passes of 4-12 rows have
// independent chains across rows; 1-3 rows interleave max(2, kRowChains / rows)
// sub-blocks, so at least 2 x kRowChains FMA chains hide the FMA latency.
inline constexpr int kSubBlock = 64;
inline constexpr int kRowChains = 4;
static_assert(kColumnBlock % kSubBlock == 0, "a column block holds whole sub-blocks");
// Bytes of the per-thread pack buffer (PanelArgs::xpack).
inline constexpr int64_t kPackFloats = int64_t{kRowBlock} * kColumnBlock;

}  // namespace dcf::cpu::kernels
