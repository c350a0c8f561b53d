// The MLP activations between the up and down projections: f32 GEMM output in, the compute
// dtype (the down projection's input) out.
#pragma once

#include <cstdint>

#include "engine/simt/cuda_compat.h"
#include "engine/cuda/dcmha_attention.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {

enum class Activation {
  kSwiGlu,  // dcformer: out = silu(in[:, :F]) * in[:, F:2F], in = [w1 h | w3 h]
  kGelu,    // dcpythia: out = gelu_erf(in[:, :F]), in = w1 h + b1
};

struct ActivationParams {
  Activation kind = Activation::kSwiGlu;
  int rows = 0;               // T
  int width = 0;              // F
  const float* in = nullptr;  // [T, 2F] (SwiGLU) or [T, F] (GELU) f32
  void* out = nullptr;        // [T, F] of out_type
  ElemType out_type = ElemType::kF32;
};

cudaError_t LaunchActivation(const ActivationParams& p, cudaStream_t stream);

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
