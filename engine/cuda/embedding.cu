#include "engine/cuda/device_util.cuh"
#include "engine/cuda/embedding.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace {

constexpr int kThreads = 256;

// One block per token.
template <typename T>
__global__ void EmbeddingKernel(const int32_t* __restrict__ tokens,
                                const int32_t* __restrict__ chained, int vocab,
                                const T* __restrict__ table, int dim, float* __restrict__ out) {
  const int t = blockIdx.x;
  int id = tokens[t];
  if (id < 0) {  // chained: what the previous step sampled at row -2 - id
    id = chained[-2 - id];
    if (id < 0 || id >= vocab) id = 0;
  }
  const T* row = table + static_cast<int64_t>(id) * dim;
  float* dst = out + static_cast<int64_t>(t) * dim;
  for (int e = threadIdx.x; e < dim; e += blockDim.x) dst[e] = dev::ToFloat(row[e]);
}

struct Launch {
  template <typename T>
  static cudaError_t Run(const EmbeddingParams& p, cudaStream_t stream) {
    DCF_LAUNCH(EmbeddingKernel<T>, p.num_tokens, kThreads, 0, stream, p.tokens, p.chained, p.vocab,
               static_cast<const T*>(p.table), p.dim, p.out);
    return cudaGetLastError();
  }
};

}  // namespace

cudaError_t LaunchEmbedding(const EmbeddingParams& p, cudaStream_t stream) {
  if (p.num_tokens <= 0) return cudaSuccess;
  return dev::DispatchElem<Launch>(p.table_type, p, stream);
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
