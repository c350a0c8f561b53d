// Weight matrices of the CPU backend in the layout its matmul kernels stream, and the matmul
// itself: y = x W^T with fp32 activations (except int8 x int8, below) and fp32 accumulation,
// weights kept in memory as F32, F16, BF16 or int8 and widened to fp32 inside the kernel
// (widening is exact, so a 16-bit checkpoint gives the same products as its fp32 conversion).
// A matrix has one kernels::WeightType (matmul_kernels.h), which picks its layout and kernel.
//
// Layout: W [out, in] is cut into panels of kPanel = 32 output rows (the last one padded
// with zeros); a panel stores its `in` columns one after the other, 32 values each:
//   F32, F16: panel[k * 32 + j] = W[32 p + j][k]
//   BF16:     pairs (j, j + 16) share a 32-bit word, j in the low half:
//             panel[k * 32 + 2 j] = W[32 p + j][k], panel[k * 32 + 2 j + 1] = W[32 p + 16 + j][k]
//             (so one shift and one mask turn 32 bf16 into two vectors of 16 floats).
//   int8 (weight-only quantization, docs/QUANTIZATION.md): a panel is [in, 32] int8
//             (panel[k * 32 + j] = q[32 p + j][k]) followed by its scales
//             [ceil(in / G), 32] bf16 (scale[g * 32 + j] for columns [g G, g G + G)), so
//             W[o][k] = q[o][k] * scale[o][k / G], symmetric, q in [-127, 127]. The kernel
//             widens q * scale to fp32 (exact: 7 by 8 significant bits) and multiplies as
//             for the other dtypes, so an int8 matrix gives the same products as the fp32
//             matrix of its dequantized values.
//   int8 for int8 x int8 products (QuantizeInt8 with Int8Matrices::activations): the same q and
//             scales, laid out for VNNI (kernels::kWeightI8A8 in matmul_kernels.h: per
//             group, four columns of each output together, the group's scales and sums of
//             q after it); MatMul quantizes each row of x per group (QuantizeActivationRowInt8
//             in engine/weights/int8_quant.h) and sums x_q * q exactly in integers, so the
//             products differ from the weight-only ones by the activations' rounding.
// One pass over a panel computes its 32 outputs for up to 12 rows of x at once (int8 x int8:
// 4), so a decode step of M <= 12 sequences (4) reads every weight from memory exactly
// once; larger M re-reads a panel from cache, not from memory.
//
// Thread-safety: a PackedMatrix is immutable after construction; MatMul may run
// concurrently on the same matrix. MatMul itself splits panels between threads (team.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/cpu/cpu_isa.h"
#include "engine/cpu/large_buffer.h"
#include "engine/cpu/matmul_kernels.h"
#include "engine/cpu/team.h"
#include "engine/weights/dtype.h"
#include "engine/weights/int8_quant.h"

namespace dcf::cpu {

class PackedMatrix {
 public:
  static constexpr int kPanel = kernels::kPanelOutputs;

  PackedMatrix() = default;

  // W given row by row: w [out, in] in `src` dtype (a Linear weight, y = x w^T), stored
  // as `dtype` (a copy when equal, else rounded to nearest even).
  static PackedMatrix FromRows(const void* w, DType src, int64_t out, int64_t in, DType dtype);
  // W given column by column: w [in, out] with row stride `ld` elements (y = x w, e.g. the
  // dynamic-weight projection dw1 [E, C*K]).
  static PackedMatrix FromColumns(const void* w, DType src, int64_t in, int64_t out, int64_t ld,
                                  DType dtype);

  // A block of consecutive output rows of a concatenated matrix.
  struct Source {
    const void* data = nullptr;
    DType dtype = DType::kF32;
    int64_t rows = 0;       // output rows it contributes
    bool columns = false;   // element (o, k) at data[k * ld + o], else data[o * ld + k]
    int64_t ld = 0;
    // dtype kI8 (already quantized rows, QuantizeInt8 only; row-major with ld = in): the
    // bf16 scales [rows, ceil(in / group)] of the group size QuantizeInt8 is given.
    const uint16_t* scales = nullptr;
  };
  // The sources' rows one after the other, all with `in` columns: one product computes
  // several matrices that read the same x (e.g. q, k, v and the dynamic-weight projections).
  static PackedMatrix Concat(const std::vector<Source>& sources, int64_t in, DType dtype);
  // The dtype Concat should keep for `sources`: theirs when they agree, else F32 (widening
  // is exact).
  static DType CommonDType(const std::vector<Source>& sources);

  // Group sizes QuantizeInt8 accepts (a divisor of the kernels' column block).
  static bool ValidInt8GroupSize(int group) { return dcf::ValidInt8GroupSize(group); }
  // The sources' rows as Concat lays them out, each row quantized to int8 in groups of
  // int8.group columns by QuantizeRowInt8 (engine/weights/int8_quant.h); kI8 sources (an int8
  // checkpoint) are copied with their scales. With int8.activations, laid out for int8 x int8
  // products (above). An empty matrix when the group fails ValidInt8GroupSize.
  static PackedMatrix QuantizeInt8(const std::vector<Source>& sources, int64_t in,
                                   Int8Matrices int8);
  // An int8 matrix from already quantized values (a checkpoint written by
  // dcformer-quantize): q [out, in] int8 row-major, scales [out, ceil(in / group)] bf16 bits.
  static PackedMatrix FromInt8Rows(const int8_t* q, const uint16_t* scales, int64_t out,
                                   int64_t in, Int8Matrices int8);

  int64_t in() const { return in_; }
  int64_t out() const { return out_; }
  // The layout, and the kernel MatMul runs.
  kernels::WeightType weight_type() const { return type_; }
  // The storage dtype of a 16/32-bit matrix; F32 for an int8 one (see int8_group()).
  DType dtype() const;
  // The group size of an int8 matrix; 0 for the others.
  int int8_group() const { return group_; }
  // An int8 matrix whose products quantize x to int8 too (kernels::kWeightI8A8).
  bool int8_activations() const { return type_ == kernels::kWeightI8A8; }
  int64_t num_groups() const { return group_ == 0 ? 0 : Int8Groups(in_, group_); }
  bool empty() const { return out_ == 0; }
  int64_t num_panels() const { return (out_ + kPanel - 1) / kPanel; }
  // Bytes of one panel (weights, and for int8 its scales).
  size_t panel_bytes() const {
    return static_cast<size_t>(kernels::PanelBytes(type_, in_, group_));
  }
  size_t nbytes() const { return static_cast<size_t>(num_panels()) * panel_bytes(); }
  const void* data() const { return data_.data(); }

  // W[o][k] as fp32 (tests and debugging).
  float At(int64_t o, int64_t k) const;
  // int8 matrices: q[o][k] and the bf16 bits of its group's scale.
  int8_t QuantAt(int64_t o, int64_t k) const;
  uint16_t ScaleBitsAt(int64_t o, int64_t k) const;

 private:
  int64_t in_ = 0, out_ = 0;
  kernels::WeightType type_ = kernels::kWeightF32;
  int group_ = 0;  // the int8 types' columns per scale
  LargeBuffer data_;  // num_panels panels of panel_bytes() (huge pages when large)
};

// Room for the rows of x a product quantizes (int8 x int8) or packs (the others; MatMul's
// `scratch`): reserved ahead (CpuBackend::Prepare), so that no product allocates. One
// product at a time.
struct MatMulScratch {
  std::vector<uint8_t> xq;     // int8 x int8: [rows, RoundUpTo4(in)]
  std::vector<float> xs;       // int8 x int8: [rows, Int8Groups(in, group)]
  std::vector<float> xpacked;  // other weights, AVX-512, on threads: x packed, rows * in

  // Enough for products of up to `rows` rows and `in` columns: of int8 x int8 matrices in
  // groups of `group` when `int8_activations`, else of the others.
  void Reserve(int64_t rows, int64_t in, int group, bool int8_activations);
};

// y[rows, out] (row stride ldy) = x[rows, in] (row stride ldx) * W^T (+ bias[out] when not
// null), accumulated in fp32. `isa` picks the kernel (clamped to what the CPU supports).
// Runs on OpenMP threads over panels when the product is large enough to pay for it.
// int8 x int8 matrices quantize x into `scratch`; products of the others split between
// threads pack x there once for all of them (AVX-512, 4 or more rows); both grow when too
// small. Without a scratch (or inside a parallel region, where each thread runs its own
// product) into buffers of the calling thread, which grow to the largest product it ran and
// stay; a product on one thread packs x into such a buffer too.
// Each product split between threads runs on a Team (team.h) of its own.
void MatMul(const float* x, int64_t ldx, int64_t rows, const PackedMatrix& w, const float* bias,
            float* y, int64_t ldy, Isa isa = ActiveIsa(), MatMulScratch* scratch = nullptr);

// The same product on the threads of `team`, every one of which calls it with the same
// arguments (a CPU backend step runs all its products on one team): the same bits. `scratch`
// (required) is shared by the team. Returns on every thread after a barrier, so y is
// complete.
void MatMul(Team& team, const float* x, int64_t ldx, int64_t rows, const PackedMatrix& w,
            const float* bias, float* y, int64_t ldy, Isa isa, MatMulScratch* scratch);

}  // namespace dcf::cpu
