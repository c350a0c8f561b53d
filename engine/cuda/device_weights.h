// The model's weights on the device, laid out for the CUDA backend's layer loop: matrices in
// the compute dtype, converted tensor by tensor from the checkpoint's stored dtype while
// uploading (the host never holds a converted copy of the whole model), qkw too (read by
// every decode token of every layer: 16 bits halve its traffic); norms, biases and qk-norm
// scales in f32.
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
#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {

struct DeviceLayerWeights {
  DeviceBuffer attn_norm_w, attn_norm_b;  // [E] f32 (bias: dcpythia only)
  DeviceBuffer w_in;                      // [3E + C*K + C*N, E] dtype (see above)
  DeviceBuffer b_in;                      // [3E + C*K + C*N] f32: wqkv bias then zeros; or empty
  DeviceBuffer q_norm, k_norm;            // [hd] f32, empty without qk-norm
  DeviceBuffer qkw;                       // [C, K, 2I*N] dtype
  DeviceBuffer wo;                        // [E, E] dtype
  DeviceBuffer wo_b;                      // [E] f32 or empty
  DeviceBuffer ffn_norm_w, ffn_norm_b;    // [E] f32
  DeviceBuffer w_up;                      // [2F, E] (w1 | w3) or [F, E] (dcpythia) dtype
  DeviceBuffer b_up;                      // [F] f32 or empty
  DeviceBuffer w_down;                    // [E, F] dtype
  DeviceBuffer b_down;                    // [E] f32 or empty
};

struct DeviceWeights {
  DeviceBuffer embed;  // [V, E] dtype
  std::vector<DeviceLayerWeights> layers;
  DeviceBuffer norm_w, norm_b;  // [E] f32
  DeviceBuffer output;          // [V, E] dtype
  size_t bytes = 0;             // device bytes of all of the above
};

// Uploads `weights` (validated against `config` by LoadModelWeights, any stored dtype) in
// `dtype`, releasing each host tensor once it is on the device. ResourceExhausted when the
// device memory runs out (naming the tensor), Internal on other CUDA errors. With
// `check_finite` (--check-weights) the converted values are scanned too: InvalidArgument
// naming the tensor when `dtype` cannot hold one (F32 -> F16 beyond 65504).
absl::StatusOr<DeviceWeights> UploadWeights(const ModelConfig& config, ModelWeights weights,
                                            ElemType dtype, bool check_finite);

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
