// The CUDA backend's GEMM: every projection of the model is a "Linear"
//   y[M, N] (f32) = x[M, K] . w[N, K]^T  (+ bias[N]) (+ y when accumulating)
// with x and w in the compute dtype (f32, bf16 or f16) and fp32 accumulation. Accumulating
// into y fuses the residual adds into the output projections (the residual stream is f32).
//
// Real build: cuBLASLt (tensor cores for bf16/f16; CUBLAS_COMPUTE_32F, so f32 inputs are not
// rounded to TF32), bias via the BIAS epilogue, `workspace_bytes` of device workspace. A plan
// (descriptors + algorithm) serves one m bucket of one product shape (gemm_plan.h): Prepare
// makes the plans of every product the steps will run, timing the heuristic's candidates
// with CUDA events and keeping the fastest; a product that was not prepared gets the
// heuristic's first candidate valid over its bucket, untimed, in a bounded LRU. Emulator
// build: OpenBLAS sgemm on the emulated device memory (host memory), converting 16-bit
// inputs to f32 first; its plans are the same bookkeeping with nothing to choose.
//
// Quantized weights (GemmArgs::wtype, docs/QUANTIZATION.md "GPU"): gemm_quant.h, in both
// builds the same kernels around the library's product: dense panels of the decoded codes,
// or, with fp8 activations, cuBLASLt's FP8 GEMM (the emulator: E4M3 codes widened exactly to
// f32, then sgemm), then the scale epilogue.
//
// Not thread-safe: one owner issuing work on its stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/simt/cuda_compat.h"
#include "engine/cuda/dcmha_attention.h"
#include "engine/cuda/gemm_plan.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {

// How a product's weights are stored (docs/QUANTIZATION.md, "GPU"): in the compute dtype, or
// quantized with one fp32 scale per output channel n, w[n, k] ~= decode(q[n, k]) * w_scale[n].
enum class WeightType : int {
  kDense = 0,  // w in GemmArgs::dtype, like x
  kI8 = 1,     // int8 codes, decode(q) = q
  kFp8 = 2,    // fp8 E4M3 codes, decode(q) = the E4M3 value (exact in bf16, f16 and f32)
};
const char* WeightTypeName(WeightType t);  // "dense", "int8", "fp8"

// A quantized product computes, for every output (m, n), with S the f32 sum of x[m, k] *
// decode(q[n, k]) (in the order of the kernel or library that runs it):
//   v = S * w_scale[n] (rounded on its own, never fused), then + bias[n], then y = v or y + v.
// With fp8_activations (kFp8 weights, the library path of more than kGemvMaxRows rows) x is
// first quantized per row to E4M3 (gemm_quant.h, LaunchQuantizeRowsFp8: x_scale[m] = amax /
// 448) and S sums e4m3(x) * decode(q) on FP8 tensor cores; then v = (S * x_scale[m]) *
// w_scale[n] (each product rounded), + bias[n], as above.
struct GemmArgs {
  int m = 0;                // M rows (tokens)
  int n = 0;                // N output features
  int k = 0;                // K input features
  const void* x = nullptr;  // [M, K] of dtype, rows ldx elements apart
  int64_t ldx = 0;
  const void* w = nullptr;  // [N, K] of dtype (kDense) or of 1-byte codes, rows K elements apart
  ElemType dtype = ElemType::kF32;  // x's, and w's when kDense
  WeightType wtype = WeightType::kDense;
  const float* w_scale = nullptr;  // [N] f32 per output channel (quantized weights only)
  bool fp8_activations = false;    // kFp8 weights only; read by Gemm::Linear (above)
  const float* bias = nullptr;     // [N] f32, or null
  float* y = nullptr;              // [M, N] f32, rows ldy elements apart
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

  // Enqueues the product on `stream`. InvalidArgument for inconsistent shapes;
  // FailedPrecondition for fp8 activations on a device without the FP8 GEMM
  // (Fp8GemmSupport); Internal when the library fails (e.g. after a sticky device error).
  absl::Status Linear(const GemmArgs& args, cudaStream_t stream);

  // Makes (pinned) plans for every m bucket from min_m to each product's m: `products` are
  // the products the steps will run, each with m = the most rows it will have and pointers
  // to buffers that hold that many (on a GPU the candidates are timed on them, so they are
  // overwritten; nothing may be in flight on them). Drops every earlier plan first. After
  // it, Linear on any of these shapes with min_m <= m <= its m builds nothing (quantized
  // products: nor allocates; their workspace is sized here, gemm_quant.h). Blocks until
  // the timing ends. Internal when the library fails or has no algorithm for a product.
  absl::Status Prepare(absl::Span<const GemmArgs> products, int min_m, cudaStream_t stream);

  struct Stats {
    int pinned_plans = 0;            // made by Prepare
    int cached_plans = 0;            // made on first use, held now (<= kLazyPlanCapacity)
    int64_t plans_built_on_use = 0;  // Linear calls that had to make a plan
    int64_t evictions = 0;           // plans made on use and dropped again
  };
  Stats stats() const;

  // What Prepare chose per product and bucket (the emulator has no candidates to time).
  const std::vector<GemmPlanChoice>& choices() const;

  // Device workspace held (0 in the emulator), and that of the quantized products (both
  // builds).
  size_t workspace_bytes() const;
  size_t quant_workspace_bytes() const;

  // Whether this device runs the FP8 GEMM of fp8 activations (Fp8GemmSupport; the emulator
  // reports compute capability 9.0).
  bool fp8_gemm_supported() const;

  // At most this many plans made on first use are kept (least recently used dropped).
  static constexpr int kLazyPlanCapacity = 32;
  // Heuristic candidates Prepare asks for and times per bucket.
  static constexpr int kCandidates = 8;

 private:
  struct Impl;
  explicit Gemm(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Checks the shape fields of `a` (both builds).
absl::Status ValidateGemmArgs(const GemmArgs& a);

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
