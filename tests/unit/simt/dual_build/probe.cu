// Does not include probe.h: there `sim` and `gpu` are ordinary namespaces, here the build's
// one is inline; the mangled names are the same.
#include "engine/simt/cuda_compat.h"

namespace dcf::cuda_test {
inline namespace DCF_CUDA_NS {
namespace {

__global__ void SquareKernel(int* value) { value[threadIdx.x] *= value[threadIdx.x]; }

}  // namespace

int SquareOnDevice(int x, int* result) {
  int* device = nullptr;
  cudaError_t e = cudaMalloc(&device, sizeof(int));
  if (e == cudaSuccess) e = cudaMemcpy(device, &x, sizeof(int), cudaMemcpyHostToDevice);
  if (e == cudaSuccess) {
    DCF_LAUNCH(SquareKernel, 1, 1, 0, nullptr, device);
    e = cudaGetLastError();
  }
  if (e == cudaSuccess) e = cudaMemcpy(result, device, sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(device);
  return static_cast<int>(e);
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda_test
