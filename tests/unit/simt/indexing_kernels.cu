// 3-D grids and blocks: every thread reports its built-ins.
#include "engine/simt/cuda_compat.h"
#include "tests/unit/simt/test_kernels.h"

namespace dcf::cuda_test {
inline namespace DCF_CUDA_NS {
namespace {

__global__ void WriteIndicesKernel(int* __restrict__ out) {
  const int block_linear = blockIdx.x + blockIdx.y * gridDim.x + blockIdx.z * gridDim.x * gridDim.y;
  const int threads = blockDim.x * blockDim.y * blockDim.z;
  const int thread_linear =
      threadIdx.x + threadIdx.y * blockDim.x + threadIdx.z * blockDim.x * blockDim.y;
  int* o = out + (static_cast<long long>(block_linear) * threads + thread_linear) * 12;
  o[0] = threadIdx.x;
  o[1] = threadIdx.y;
  o[2] = threadIdx.z;
  o[3] = blockIdx.x;
  o[4] = blockIdx.y;
  o[5] = blockIdx.z;
  o[6] = blockDim.x;
  o[7] = blockDim.y;
  o[8] = blockDim.z;
  o[9] = gridDim.x;
  o[10] = gridDim.y;
  o[11] = gridDim.z;
}

}  // namespace

cudaError_t LaunchWriteIndices(int* out, dim3 grid, dim3 block, cudaStream_t stream) {
  DCF_LAUNCH(WriteIndicesKernel, grid, block, 0, stream, out);
  return cudaGetLastError();
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda_test
