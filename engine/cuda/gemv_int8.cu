// LaunchGemv (gemv.h) with int8 weights and per-channel scales: the kernel of gemv_kernel.cuh
// instantiated for Int8Code (a file of its own, so that the weight storages compile in parallel).
#include "engine/cuda/gemv_kernel.cuh"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace gemv_detail {

cudaError_t DispatchInt8(const Params& p, bool vec, int blocks, cudaStream_t stream) {
  return DispatchWeights<Int8Code>(p, vec, blocks, stream);
}

}  // namespace gemv_detail
}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
