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
  // [T] ids (validated by the host: 0 <= id < vocab), or -2 - r (< -1): the token the
  // previous step sampled at its sampled row r, read from `chained` (a chained token,
  // engine/execution/step_batch.h; the host translated the slot into the row).
  const int32_t* tokens = nullptr;
  const int32_t* chained = nullptr;  // [rows] the previous step's sampled ids; -1: none drawn
  int vocab = 0;                     // ids a chained token may take; others read as 0
  const void* table = nullptr;       // [vocab, E] of table_type
  ElemType table_type = ElemType::kF32;
  float* out = nullptr;  // [T, E] f32 (the residual stream)
};

// out[t] = table[id] as f32, id = tokens[t], or for a chained token the id `chained` holds
// (0 where that row drew nothing: the host drops such a row).
cudaError_t LaunchEmbedding(const EmbeddingParams& p, cudaStream_t stream);

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
