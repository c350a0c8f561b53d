#include "tests/unit/simt/stream_kernels.h"

namespace dcf::cuda_test {
inline namespace DCF_CUDA_NS {
namespace {

__global__ void AxpbKernel(const float* in, float* out, float a, float b, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * in[i] + b;
}

__global__ void OrderKernel(unsigned int* counter, unsigned int* block_rank,
                            unsigned int* thread_rank) {
  DCF_SHARED(unsigned int, next, 1);
  if (threadIdx.x == 0) next[0] = 0u;
  __syncthreads();
  // The order in which threads pass this point, and blocks start their second phase.
  const unsigned int t = atomicAdd(&next[0], 1u);
  thread_rank[blockIdx.x * blockDim.x + threadIdx.x] = t;
  __syncthreads();
  if (threadIdx.x == 0) block_rank[blockIdx.x] = atomicAdd(counter, 1u);
}

__global__ void FloatSumKernel(const float* in, float* sum, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(sum, in[i]);
}

}  // namespace

cudaError_t LaunchAxpb(const float* in, float* out, float a, float b, int n,
                       cudaStream_t stream) {
  DCF_LAUNCH(AxpbKernel, (n + 127) / 128, 128, 0, stream, in, out, a, b, n);
  return cudaGetLastError();
}

cudaError_t LaunchOrder(unsigned int* counter, unsigned int* block_rank,
                        unsigned int* thread_rank, int blocks, int threads,
                        cudaStream_t stream) {
  DCF_LAUNCH(OrderKernel, blocks, threads, 0, stream, counter, block_rank, thread_rank);
  return cudaGetLastError();
}

cudaError_t LaunchFloatSum(const float* in, float* sum, int n, cudaStream_t stream) {
  DCF_LAUNCH(FloatSumKernel, (n + 63) / 64, 64, 0, stream, in, sum, n);
  return cudaGetLastError();
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda_test
