// Weight matrices of the CPU backend in the layout its matmul kernels stream, and the matmul
// itself: y = x W^T with fp32 activations and fp32 accumulation, weights kept in memory as
// F32, F16 or BF16 and widened to fp32 inside the kernel (widening is exact, so a 16-bit
// checkpoint gives the same products as its fp32 conversion).
//
// Layout: W [out, in] is cut into panels of kPanel = 32 output rows (the last one padded
// with zeros); a panel stores its `in` columns one after the other, 32 values each:
//   F32, F16: panel[k * 32 + j] = W[32 p + j][k]
//   BF16:     pairs (j, j + 16) share a 32-bit word, j in the low half:
//             panel[k * 32 + 2 j] = W[32 p + j][k], panel[k * 32 + 2 j + 1] = W[32 p + 16 + j][k]
//             (so one shift and one mask turn 32 bf16 into two vectors of 16 floats).
// One pass over a panel computes its 32 outputs for up to 12 rows of x at once, so a
// decode step of M <= 12 sequences reads every weight from memory exactly once; larger M
// re-reads a panel from cache, not from memory.
//
// Thread-safety: a PackedMatrix is immutable after construction; MatMul may run
// concurrently on the same matrix. MatMul itself uses OpenMP threads over panels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/cpu/cpu_isa.h"
#include "engine/cpu/large_buffer.h"
#include "engine/weights/dtype.h"

namespace dcf::cpu {

class PackedMatrix {
 public:
  static constexpr int kPanel = 32;

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
  };
  // The sources' rows one after the other, all with `in` columns: one product computes
  // several matrices that read the same x (e.g. q, k, v and the dynamic-weight projections).
  static PackedMatrix Concat(const std::vector<Source>& sources, int64_t in, DType dtype);
  // The dtype Concat should keep for `sources`: theirs when they agree, else F32 (widening
  // is exact).
  static DType CommonDType(const std::vector<Source>& sources);

  int64_t in() const { return in_; }
  int64_t out() const { return out_; }
  DType dtype() const { return dtype_; }
  bool empty() const { return out_ == 0; }
  int64_t num_panels() const { return (out_ + kPanel - 1) / kPanel; }
  size_t nbytes() const {
    return static_cast<size_t>(num_panels()) * kPanel * in_ * DTypeSize(dtype_);
  }
  const void* data() const { return data_.data(); }

  // W[o][k] as fp32 (tests and debugging).
  float At(int64_t o, int64_t k) const;

 private:

  int64_t in_ = 0, out_ = 0;
  DType dtype_ = DType::kF32;
  LargeBuffer data_;  // [num_panels, in, 32] of dtype_ (huge pages when large)
};

// y[rows, out] (row stride ldy) = x[rows, in] (row stride ldx) * W^T (+ bias[out] when not
// null), accumulated in fp32. `isa` picks the kernel (clamped to what the CPU supports).
// Runs on OpenMP threads over panels when the product is large enough to pay for it.
void MatMul(const float* x, int64_t ldx, int64_t rows, const PackedMatrix& w, const float* bias,
            float* y, int64_t ldy, Isa isa = ActiveIsa());

}  // namespace dcf::cpu
