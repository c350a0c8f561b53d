#include "engine/cuda/gemm.h"

#include "absl/strings/str_cat.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {

const char* WeightTypeName(WeightType t) {
  switch (t) {
    case WeightType::kDense:
      return "dense";
    case WeightType::kI8:
      return "int8";
    case WeightType::kFp8:
      return "fp8";
  }
  return "?";
}

absl::Status ValidateGemmArgs(const GemmArgs& a) {
  if (a.m < 0 || a.n <= 0 || a.k <= 0 || a.ldx < a.k || a.ldy < a.n || a.x == nullptr ||
      a.w == nullptr || a.y == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("GEMM of shape m=", a.m, " n=", a.n, " k=", a.k,
                                                   " ldx=", a.ldx, " ldy=", a.ldy,
                                                   " is malformed"));
  }
  if ((a.wtype != WeightType::kDense) != (a.w_scale != nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GEMM with ", WeightTypeName(a.wtype),
        " weights: quantized weights need their per-channel scales, dense ones take none"));
  }
  if (a.fp8_activations && a.wtype != WeightType::kFp8) {
    return absl::InvalidArgumentError("GEMM with fp8 activations needs fp8 weights");
  }
  return absl::OkStatus();
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
