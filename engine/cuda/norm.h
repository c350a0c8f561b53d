// RMSNorm (dcformer) and LayerNorm (dcpythia) over rows of the f32 residual stream, writing
// the compute dtype that the next GEMM reads. Statistics are accumulated in double, like the
// CPU oracle (engine/cpu/cpu_ops.h).
#pragma once

#include <cstdint>

#include "engine/simt/cuda_compat.h"
#include "engine/cuda/dcmha_attention.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {

struct NormParams {
  int rows = 0;                        // R output rows
  int dim = 0;                         // E
  const float* x = nullptr;            // [*, E] f32 input rows
  const int32_t* row_index = nullptr;  // [R] input row of each output row; null: row r
  bool layer_norm = false;             // false: RMSNorm (no mean, no bias)
  double eps = 1e-6;
  const float* weight = nullptr;  // [E] f32
  const float* bias = nullptr;    // [E] f32 or null
  void* out = nullptr;            // [R, E] of out_type
  // Optional second norm of the same rows (dcpythia's parallel residual normalises x once
  // for attention and once for the MLP): same statistics, its own weight and bias.
  const float* weight2 = nullptr;  // [E] f32, or null for no second output
  const float* bias2 = nullptr;    // [E] f32 or null
  void* out2 = nullptr;            // [R, E] of out_type
  ElemType out_type = ElemType::kF32;
};

// RMSNorm: y = x / sqrt(mean(x^2) + eps) * w.
// LayerNorm: y = (x - mean) / sqrt(var + eps) * w + b (biased variance).
cudaError_t LaunchNorm(const NormParams& p, cudaStream_t stream);

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
