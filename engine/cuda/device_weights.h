// The model's weights on the device, laid out for the CUDA backend's layer loop: matrices in
// the compute dtype, converted tensor by tensor from the checkpoint's stored dtype while
// uploading (the host never holds a converted copy of the whole model), qkw too (read by
// every decode token of every layer: 16 bits halve its traffic); norms, biases and qk-norm
// scales in f32.
//
// Quantized matrices (UploadWeights' `matrices`, --weight-dtype int8 / fp8 on the cuda
// backends; docs/QUANTIZATION.md "GPU"): the five matrices below (w_in, wo, w_up, w_down,
// output) are quantized row by row while uploading, one f32 scale per output channel: int8 by
// QuantizeRowInt8 with one group per row (engine/weights/int8_quant.h: bf16(amax / 127),
// widened to f32), fp8 E4M3 by QuantizeRowFp8E4M3 (engine/weights/fp8_quant.h: amax / 448).
// The embedding table and qkw keep the compute dtype.
//
// Fusions made at load (DCFORMER.md section 2):
//   w_in  = [ wqkv (3E rows) | dw1^T (C*K rows) | dd^T (C*N rows) ]  [3E + C*K + C*N, E]
//           so q, k, v and both dynamic-weight projections are one GEMM;
//   w_up  = [ w1 | w3 ] [2F, E] for dcformer (one GEMM for both SwiGLU inputs), w1 for dcpythia.
#pragma once

#include <cstddef>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/simt/cuda_compat.h"
#include "engine/cuda/dcmha_attention.h"
#include "engine/cuda/device_buffer.h"
#include "engine/cuda/gemm.h"
#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {

// A weight matrix [N, K]: in the compute dtype, or 1-byte codes with a scale per row.
struct DeviceMatrix {
  DeviceBuffer w;      // [N, K] dtype (kDense) or int8 / E4M3 codes
  DeviceBuffer scale;  // [N] f32 (quantized only; empty for kDense)
  WeightType type = WeightType::kDense;
};

struct DeviceLayerWeights {
  DeviceBuffer attn_norm_w, attn_norm_b;  // [E] f32 (bias: dcpythia only)
  DeviceMatrix w_in;                      // [3E + C*K + C*N, E] (see above)
  DeviceBuffer b_in;                      // [3E + C*K + C*N] f32: wqkv bias then zeros; or empty
  DeviceBuffer q_norm, k_norm;            // [hd] f32, empty without qk-norm
  DeviceBuffer qkw;                       // [C, K, 2I*N] dtype
  DeviceMatrix wo;                        // [E, E]
  DeviceBuffer wo_b;                      // [E] f32 or empty
  DeviceBuffer ffn_norm_w, ffn_norm_b;    // [E] f32
  DeviceMatrix w_up;                      // [2F, E] (w1 | w3) or [F, E] (dcpythia)
  DeviceBuffer b_up;                      // [F] f32 or empty
  DeviceMatrix w_down;                    // [E, F]
  DeviceBuffer b_down;                    // [E] f32 or empty
};

struct DeviceWeights {
  DeviceBuffer embed;  // [V, E] dtype
  std::vector<DeviceLayerWeights> layers;
  DeviceBuffer norm_w, norm_b;  // [E] f32
  DeviceMatrix output;          // [V, E]
  size_t bytes = 0;             // device bytes of all of the above
};

// Uploads `weights` (validated against `config` by LoadModelWeights, any stored dtype) in
// `dtype`, the five matrices as `matrices` says (kDense: in `dtype`), releasing each host
// tensor once it is on the device. ResourceExhausted when the device memory runs out (naming
// the tensor), Internal on other CUDA errors. With `check_finite` (--check-weights) the
// converted values are scanned too: InvalidArgument naming the tensor when `dtype` cannot
// hold one (F32 -> F16 beyond 65504).
absl::StatusOr<DeviceWeights> UploadWeights(const ModelConfig& config, ModelWeights weights,
                                            ElemType dtype, bool check_finite,
                                            WeightType matrices = WeightType::kDense);

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
