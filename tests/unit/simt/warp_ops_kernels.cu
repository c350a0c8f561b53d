// One warp collective per thread, for checking against a host model of CUDA's semantics.
#include "engine/simt/cuda_compat.h"
#include "tests/unit/simt/test_kernels.h"

namespace dcf::cuda_test {
inline namespace DCF_CUDA_NS {
namespace {

template <typename T>
__global__ void WarpOpKernel(WarpOpKind op, const T* __restrict__ values, T* __restrict__ out,
                             int arg, int width) {
  const int t = threadIdx.x;
  const int warp_base = t / warpSize * warpSize;
  const int lanes = min(static_cast<int>(blockDim.x) - warp_base, warpSize);
  const unsigned int mask = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1u;
  const T v = values[t];
  T r = v;
  switch (op) {
    case WarpOpKind::kIdx:
      r = __shfl_sync(mask, v, arg, width);
      break;
    case WarpOpKind::kUp:
      r = __shfl_up_sync(mask, v, static_cast<unsigned int>(arg), width);
      break;
    case WarpOpKind::kDown:
      r = __shfl_down_sync(mask, v, static_cast<unsigned int>(arg), width);
      break;
    case WarpOpKind::kXor:
      r = __shfl_xor_sync(mask, v, arg, width);
      break;
    case WarpOpKind::kBallot:
      r = static_cast<T>(__ballot_sync(mask, v != T(0)));
      break;
    case WarpOpKind::kAny:
      r = static_cast<T>(__any_sync(mask, v != T(0)));
      break;
    case WarpOpKind::kAll:
      r = static_cast<T>(__all_sync(mask, v != T(0)));
      break;
    case WarpOpKind::kSyncWarp:
      __syncwarp(mask);
      break;
  }
  out[t] = r;
}

}  // namespace

template <typename T>
cudaError_t LaunchWarpOp(WarpOpKind op, const T* values, T* out, int arg, int width, int threads,
                         cudaStream_t stream) {
  DCF_LAUNCH(WarpOpKernel<T>, 1, threads, 0, stream, op, values, out, arg, width);
  return cudaGetLastError();
}

template cudaError_t LaunchWarpOp<int>(WarpOpKind, const int*, int*, int, int, int, cudaStream_t);
template cudaError_t LaunchWarpOp<unsigned int>(WarpOpKind, const unsigned int*, unsigned int*, int,
                                                int, int, cudaStream_t);
template cudaError_t LaunchWarpOp<long long>(WarpOpKind, const long long*, long long*, int, int,
                                             int, cudaStream_t);
template cudaError_t LaunchWarpOp<unsigned long long>(WarpOpKind, const unsigned long long*,
                                                      unsigned long long*, int, int, int,
                                                      cudaStream_t);
template cudaError_t LaunchWarpOp<float>(WarpOpKind, const float*, float*, int, int, int,
                                         cudaStream_t);
template cudaError_t LaunchWarpOp<double>(WarpOpKind, const double*, double*, int, int, int,
                                          cudaStream_t);

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda_test
