#include "engine/cuda/gemm.h"

#include "absl/strings/str_cat.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {

absl::Status ValidateGemmArgs(const GemmArgs& a) {
  if (a.m < 0 || a.n <= 0 || a.k <= 0 || a.ldx < a.k || a.ldy < a.n || a.x == nullptr ||
      a.w == nullptr || a.y == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("GEMM of shape m=", a.m, " n=", a.n, " k=", a.k,
                                                   " ldx=", a.ldx, " ldy=", a.ldy,
                                                   " is malformed"));
  }
  return absl::OkStatus();
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
