// LaunchGemv (gemv.h): weights streamed once per batch of <= 16 rows. The kernel is in
// gemv_kernel.cuh; this file instantiates it for weights in the compute dtype,
// gemv_int8.cu and gemv_fp8.cu for the quantized ones.
#include "engine/cuda/gemv.h"

#include "engine/cuda/gemv_kernel.cuh"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace gemv_detail {

cudaError_t DispatchDense(const Params& p, bool vec, int blocks, cudaStream_t stream) {
  return DispatchWeights<void>(p, vec, blocks, stream);
}

}  // namespace gemv_detail

namespace {

bool Aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// Every row of x and w starts 16-byte aligned: the vector loads' condition.
bool RowsAligned(const GemmArgs& a) {
  return a.k % gemv_detail::kVecElems == 0 && a.ldx % gemv_detail::kVecElems == 0 &&
         Aligned16(a.x) && Aligned16(a.w);
}

}  // namespace

bool GemvHandles(const GemmArgs& a) {
  return a.m >= 1 && a.m <= kGemvMaxRows && ValidateGemmArgs(a).ok() &&
         (a.wtype == WeightType::kDense || RowsAligned(a));
}

GemvGrid GemvGridFor(int n) {
  int r = gemv_detail::kWarps;
  while (r > 1 && (n + r - 1) / r < gemv_detail::kTargetBlocks) r /= 2;
  return {r, (n + r - 1) / r};
}

cudaError_t LaunchGemv(const GemmArgs& a, const GemvOut& out, const GemvIn& in,
                       cudaStream_t stream) {
  if (!GemvHandles(a)) return cudaErrorInvalidValue;
  const bool glu = out.epilogue == GemvEpilogue::kSwiGlu;
  if (glu && (a.n % 2 != 0 || out.act == nullptr || out.act_ld < a.n / 2 || a.accumulate ||
              (in.norm_weight != nullptr && in.layer_norm))) {
    return cudaErrorInvalidValue;
  }
  if (out.epilogue == GemvEpilogue::kGelu &&
      (out.act == nullptr || out.act_ld < a.n || a.accumulate)) {
    return cudaErrorInvalidValue;
  }
  gemv_detail::Params p;
  p.a = a;
  p.o = out;
  p.in = in;
  p.features = glu ? a.n / 2 : a.n;
  const GemvGrid g = GemvGridFor(p.features);
  p.per_block = g.features_per_block;
  // Vector loads (16 bytes of x, 16 or 8 of w) when every row starts aligned.
  const bool vec = RowsAligned(a) && (in.norm_weight == nullptr || Aligned16(in.norm_weight)) &&
                   (in.norm_bias == nullptr || Aligned16(in.norm_bias));
  if (a.wtype != WeightType::kDense && !vec) return cudaErrorInvalidValue;
  switch (a.wtype) {
    case WeightType::kDense:
      return gemv_detail::DispatchDense(p, vec, g.blocks, stream);
    case WeightType::kI8:
      return gemv_detail::DispatchInt8(p, vec, g.blocks, stream);
    case WeightType::kFp8:
      return gemv_detail::DispatchFp8(p, vec, g.blocks, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
