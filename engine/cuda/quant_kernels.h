// The kernels around the library GEMM of quantized weights (gemm_quant.h): activations to
// fp8 per row, 1-byte weight codes to the compute dtype, and the epilogue that applies the
// scales, the bias and the residual add. Plain element-wise / per-row kernels; every rule
// below is exact arithmetic or one rounding named here, so the emulator and a GPU give the
// same bits.
#pragma once

#include <cstdint>

#include "engine/simt/cuda_compat.h"
#include "engine/cuda/dcmha_attention.h"  // ElemType
#include "engine/cuda/gemm.h"             // WeightType

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {

// Each row m of x [rows, k] (dtype, rows ldx apart) to fp8 E4M3 codes q [rows, ldq] (columns
// k..ldq zero) and its scale x_scale[m] (docs/QUANTIZATION.md "GPU"):
//   amax = max |x[m, :]|;  x_scale[m] = amax / 448 (f32 division; 0 for a zero row)
//   q    = e4m3_satfinite(x * (448 / amax))   ((x / amax) * 448 where 448 / amax overflows;
//          0 for a zero row); a NaN or an infinity in the row makes its outputs NaN (an infinite
//          amax gives 448 / amax = 0 and inf * 0 a NaN code).
struct QuantizeRowsFp8Params {
  int rows = 0, k = 0;
  const void* x = nullptr;
  int64_t ldx = 0;
  ElemType dtype = ElemType::kBF16;
  uint8_t* q = nullptr;
  int64_t ldq = 0;  // >= k
  float* x_scale = nullptr;  // [rows]
};
cudaError_t LaunchQuantizeRowsFp8(const QuantizeRowsFp8Params& p, cudaStream_t stream);

// Rows of 1-byte weight codes [rows, k] (kI8 or kFp8) to their values in `dtype` [rows, k]:
// exact (int8 and every E4M3 value are bf16, f16 and f32 values); no scale.
struct DequantRowsParams {
  int rows = 0, k = 0;
  const uint8_t* w = nullptr;
  WeightType wtype = WeightType::kI8;
  void* out = nullptr;
  ElemType dtype = ElemType::kBF16;
};
cudaError_t LaunchDequantRows(const DequantRowsParams& p, cudaStream_t stream);

// y[m, n] (n < cols) from the library's sums S[m, n] (f32, rows lds apart):
//   v = S * w_scale[n]                      (x_scale null: weight-only)
//   v = (S * x_scale[m]) * w_scale[n]       (fp8 activations)
// each product rounded on its own (never fused), then v + bias[n] when there is a bias, then
// y = v, or y + v when accumulating. y, w_scale and bias point at the panel's first column.
struct ScaleEpilogueParams {
  int rows = 0, cols = 0;
  const float* sums = nullptr;
  int64_t lds = 0;
  const float* w_scale = nullptr;  // [cols]
  const float* x_scale = nullptr;  // [rows] or null
  const float* bias = nullptr;     // [cols] or null
  float* y = nullptr;
  int64_t ldy = 0;
  bool accumulate = false;
};
cudaError_t LaunchScaleEpilogue(const ScaleEpilogueParams& p, cudaStream_t stream);

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
