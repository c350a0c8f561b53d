// cudaError_t -> absl::Status for the CUDA backend's host code (both builds).
#pragma once

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/simt/cuda_compat.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {

// OK for cudaSuccess; otherwise Internal("CUDA error in <what>: <name>: <text>").
inline absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUDA error in ", what, ": ", cudaGetErrorName(error),
                                          ": ", cudaGetErrorString(error)));
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda

// Returns the Status of a failed CUDA runtime call from the enclosing function.
#define DCF_CUDA_RETURN_IF_ERROR(call, what)                                                   \
  do {                                                                                         \
    const cudaError_t dcf_cuda_error_ = (call);                                                \
    if (dcf_cuda_error_ != cudaSuccess) return ::dcf::cuda::CudaStatus(dcf_cuda_error_, what); \
  } while (0)
