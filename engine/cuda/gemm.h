// The CUDA backend's GEMM: every projection of the model is a "Linear"
//   y[M, N] (f32) = x[M, K] . w[N, K]^T  (+ bias[N]) (+ y when accumulating)
// with x and w in the compute dtype (f32, bf16 or f16) and fp32 accumulation. Accumulating
// into y fuses the residual adds into the output projections (the residual stream is f32).
//
// Real build: cuBLASLt (tensor cores for bf16/f16; CUBLAS_COMPUTE_32F, so f32 inputs are not
// rounded to TF32), one plan (descriptors + heuristic algorithm) cached per shape, bias via
// the BIAS epilogue, `workspace_bytes` of device workspace. Emulator build: OpenBLAS sgemm on
// the emulated device memory (host memory), converting 16-bit inputs to f32 first.
//
// Not thread-safe: one owner issuing work on its stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/simt/cuda_compat.h"
#include "engine/cuda/dcmha_attention.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {

struct GemmArgs {
  int m = 0;                // M rows (tokens)
  int n = 0;                // N output features
  int k = 0;                // K input features
  const void* x = nullptr;  // [M, K] of dtype, rows ldx elements apart
  int64_t ldx = 0;
  const void* w = nullptr;  // [N, K] of dtype, rows K elements apart
  ElemType dtype = ElemType::kF32;
  const float* bias = nullptr;  // [N] f32, or null
  float* y = nullptr;           // [M, N] f32, rows ldy elements apart
  int64_t ldy = 0;
  bool accumulate = false;  // y += x . w^T (+ bias) instead of y =
};

class Gemm {
 public:
  // Internal when the library cannot be initialised (no device, no cuBLASLt).
  static absl::StatusOr<std::unique_ptr<Gemm>> Create(size_t workspace_bytes);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // Enqueues the product on `stream`. InvalidArgument for inconsistent shapes; Internal when
  // the library fails (e.g. after a sticky device error).
  absl::Status Linear(const GemmArgs& args, cudaStream_t stream);

  // Device workspace held (0 in the emulator).
  size_t workspace_bytes() const;

 private:
  struct Impl;
  explicit Gemm(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Checks the shape fields of `a` (both builds).
absl::Status ValidateGemmArgs(const GemmArgs& a);

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
