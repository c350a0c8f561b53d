// Block reduction: warp shuffles plus a shared array of per-warp partial sums.
#include "engine/simt/cuda_compat.h"
#include "tests/unit/simt/test_kernels.h"

namespace dcf::cuda_test {
inline namespace DCF_CUDA_NS {
namespace {

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

// A helper that receives a shared array, written the way cuda_compat.h prescribes.
template <typename Smem>
__device__ float BlockSum(float v, Smem& warp_sums) {
  const int lane = threadIdx.x % warpSize;
  const int warp = threadIdx.x / warpSize;
  const int num_warps = blockDim.x / warpSize;
  v = WarpSum(v);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  v = lane < num_warps ? warp_sums[lane] : 0.0f;
  if (warp == 0) {
    for (int mask = 16; mask > 0; mask /= 2) v += __shfl_xor_sync(0xffffffffu, v, mask);
  }
  return v;
}

__global__ void __launch_bounds__(1024)
    BlockSumKernel(const float* __restrict__ in, float* __restrict__ out, int chunk) {
  DCF_SHARED(float, warp_sums, 32);
  const float* block_in = in + static_cast<long long>(blockIdx.x) * chunk;
  float v = 0.0f;
  for (int i = threadIdx.x; i < chunk; i += blockDim.x) v += block_in[i];
  v = BlockSum(v, warp_sums);
  if (threadIdx.x == 0) out[blockIdx.x] = v;
}

}  // namespace

cudaError_t LaunchBlockSum(const float* in, float* out, int chunk, int blocks, int threads,
                           cudaStream_t stream) {
  DCF_LAUNCH(BlockSumKernel, blocks, threads, 0, stream, in, out, chunk);
  return cudaGetLastError();
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda_test
