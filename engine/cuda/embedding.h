// Token embedding gather: the first op of every step.
#pragma once

#include <cstdint>

#include "engine/simt/cuda_compat.h"
#include "engine/cuda/dcmha_attention.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {

struct EmbeddingParams {
  int num_tokens = 0;               // T
  int dim = 0;                      // E
  const int32_t* tokens = nullptr;  // [T] ids (validated by the host: 0 <= id < vocab)
  const void* table = nullptr;      // [vocab, E] of table_type
  ElemType table_type = ElemType::kF32;
  float* out = nullptr;  // [T, E] f32 (the residual stream)
};

// out[t] = table[tokens[t]] as f32.
cudaError_t LaunchEmbedding(const EmbeddingParams& p, cudaStream_t stream);

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
