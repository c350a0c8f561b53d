// LaunchGemv (gemv.h) with fp8 weights and per-channel scales: the kernel of gemv_kernel.cuh
// instantiated for Fp8Code (a file of its own, so that the weight storages compile in parallel).
#include "engine/cuda/gemv_kernel.cuh"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace gemv_detail {

cudaError_t DispatchFp8(const Params& p, bool vec, int blocks, cudaStream_t stream) {
  return DispatchWeights<Fp8Code>(p, vec, blocks, stream);
}

}  // namespace gemv_detail
}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
