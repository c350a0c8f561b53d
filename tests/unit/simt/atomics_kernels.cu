// Atomics on shared and global memory across the blocks of a grid.
#include "engine/simt/cuda_compat.h"
#include "tests/unit/simt/test_kernels.h"

namespace dcf::cuda_test {
inline namespace DCF_CUDA_NS {
namespace {

__global__ void HistogramKernel(const int* __restrict__ values, int n, int bins, HistogramOut out) {
  DCF_SHARED(int, local, 64);
  for (int b = threadIdx.x; b < bins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const int stride = gridDim.x * blockDim.x;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int v = values[i];
    atomicAdd(&local[v], 1);
    atomicAdd(out.total, 1ull);
    atomicMax(out.max_value, v);
    atomicMin(out.min_value, v);
    atomicMax(out.umax, static_cast<unsigned int>(v));
    atomicAdd(out.fsum, 1.0f);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < bins; b += blockDim.x) atomicAdd(&out.hist[b], local[b]);
}

__global__ void CasExchKernel(int* counter, unsigned int* slot, unsigned int* olds) {
  const unsigned int id = blockIdx.x * blockDim.x + threadIdx.x;
  int seen = *counter;
  for (;;) {
    const int prior = atomicCAS(counter, seen, seen + 1);
    if (prior == seen) break;
    seen = prior;
  }
  olds[id] = atomicExch(slot, id);
}

}  // namespace

cudaError_t LaunchHistogram(const int* values, int n, int bins, HistogramOut out, int blocks,
                            int threads, cudaStream_t stream) {
  DCF_LAUNCH(HistogramKernel, blocks, threads, 0, stream, values, n, bins, out);
  return cudaGetLastError();
}

cudaError_t LaunchCasExch(int* counter, unsigned int* slot, unsigned int* olds, int blocks,
                          int threads, cudaStream_t stream) {
  DCF_LAUNCH(CasExchKernel, blocks, threads, 0, stream, counter, slot, olds);
  return cudaGetLastError();
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda_test
