// The library path of products with quantized weights (GemmArgs::wtype kI8 or kFp8) that the
// GEMV does not take (more than kGemvMaxRows rows: prefill, large decode batches), shared by
// both builds of Gemm (gemm_sim.cc, gemm_cublaslt.cc), which only supply the library's
// product. The weights are cut into panels of up to QuantPanelRows rows (a bounded
// workspace), and for each panel:
//   - weight-only (int8; fp8 without GemmArgs::fp8_activations): LaunchDequantRows decodes
//     the panel's codes to the compute dtype (exact: no scale), the library's dense GEMM
//     (cuBLASLt's 16-bit tensor-core GEMM on a GPU) multiplies x by it into f32 sums, and
//     LaunchScaleEpilogue writes y = [y +] (S * w_scale[n] + bias[n]);
//   - fp8 activations: x is quantized once per product (LaunchQuantizeRowsFp8: E4M3 codes
//     and a scale per row), the library's FP8 GEMM (cuBLASLt, e4m3 x e4m3 with f32
//     accumulation and output, no scale pointers: the TN layout cuBLASLt requires, as every
//     product here has) multiplies the codes into f32 sums, and LaunchScaleEpilogue applies
//     both scales, y = [y +] ((S * x_scale[m]) * w_scale[n] + bias[n]).
// The scales are applied by our epilogue kernel rather than by cuBLASLt's scale pointers:
// the same rounding steps in both builds and on every GPU that runs FP8 (the per-row times
// per-channel "outer vector" mode is Hopper-only and new in cuBLAS 12.9), at the price of one
// extra pass over the [M, N] f32 sums.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/simt/cuda_compat.h"
#include "engine/cuda/device_buffer.h"
#include "engine/cuda/gemm.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {

// OK when a device of compute capability major.minor runs cuBLASLt's FP8 GEMM (8.9, Ada,
// and later: Hopper's sm_90 is what the project builds for), else FailedPrecondition saying
// so. The one rule: the backend refuses --activation-dtype fp8 with it, Gemm::Linear a
// product with fp8_activations.
absl::Status Fp8GemmSupport(int major, int minor);

// Whether `a` (quantized) runs the FP8 GEMM: fp8 weights, fp8_activations, and K and N
// multiples of 16 (cuBLASLt's FP8 alignment: the weight rows and the quantized x rows are then
// 16-byte aligned, and so is every panel's N). Other quantized products take the weight-only
// path (a logits product of a vocabulary that is not a multiple of 16, for one).
bool UsesFp8Gemm(const GemmArgs& a);

// Weight rows per panel of `a`: all of them when their codes (FP8 GEMM) or decoded values
// (weight-only) fit 32 MiB, else the most multiples of 256 that do (at least 256).
int QuantPanelRows(const GemmArgs& a);
// Tests only: panels of `bytes` instead of 32 MiB and multiples of `quantum` rows instead of
// 256, so that small products cross panel boundaries. Not thread-safe; set before use.
void SetQuantPanelForTesting(int64_t bytes, int quantum);

// Device workspace of the quantized products (grown by EnsureQuantScratch, never shrunk).
struct QuantScratch {
  DeviceBuffer sums;     // [M, lds] f32: one panel's library product
  DeviceBuffer panel;    // [panel rows, K] compute dtype: a decoded panel (weight-only)
  DeviceBuffer x8;       // [M, K] E4M3 codes: x quantized (FP8 GEMM)
  DeviceBuffer x_scale;  // [M] f32
};

// Grows `s` to what `a` needs (a.m rows). An allocation synchronises `stream` first (queued
// products may still use the old buffers), so Gemm::Prepare sizes it for every product the
// steps will run and a step (or a graph capture) never allocates.
absl::Status EnsureQuantScratch(const GemmArgs& a, QuantScratch* s, cudaStream_t stream);

// The library products `a` runs, in order, with a.m rows, on `s` (sized for a by
// EnsureQuantScratch): dense ones (wtype kDense: x . decoded panel^T into s.sums) or FP8 ones
// (wtype kFp8 with fp8_activations, w_scale null: quantized x . panel codes^T into s.sums);
// never a bias or accumulation. For Gemm::Prepare.
std::vector<GemmArgs> QuantLibraryProducts(const GemmArgs& a, const QuantScratch& s);

// One library product (validated): a dense one, or an FP8 one of QuantLibraryProducts.
using LibraryProductFn = std::function<absl::Status(const GemmArgs&)>;

// Enqueues `a` (quantized, a.m >= 1, validated) on `stream` as above, calling `product` for
// each library product of QuantLibraryProducts. Internal when a kernel launch fails.
absl::Status RunQuantized(const GemmArgs& a, QuantScratch& s, const LibraryProductFn& product,
                          cudaStream_t stream);

// What both builds' Gemm::Linear and Gemm::Prepare do around their library (each build's
// Gemm::Impl holds one): validation, dense products straight to the library, quantized ones
// through the panels above on this workspace, and the refusal of fp8 activations where the
// device has no FP8 GEMM. A build supplies only its library product and its planning of one
// library product. Not thread-safe (the Gemm's).
class QuantGemm {
 public:
  // Reads the current device's compute capability (Fp8GemmSupport). Internal on a CUDA error.
  absl::Status Init();

  // Gemm::Linear: InvalidArgument for inconsistent shapes (ValidateGemmArgs); nothing for
  // m = 0; `product(a)` for dense weights; for quantized ones RunQuantized calling `product`,
  // or Fp8GemmSupport's FailedPrecondition for fp8 activations on a device without the FP8
  // GEMM.
  absl::Status Linear(const GemmArgs& a, const LibraryProductFn& product, cudaStream_t stream);

  // Gemm::Prepare (after the build dropped its plans): validates every product, then, in
  // order, `plan(p)` for a dense one; for a quantized one of p.m >= min_m, refuses fp8
  // activations as Linear does, sizes the workspace for it (EnsureQuantScratch) and calls
  // `plan` for each of its library products. Returns the first error.
  absl::Status Prepare(absl::Span<const GemmArgs> products, int min_m,
                       const LibraryProductFn& plan, cudaStream_t stream);

  bool fp8_gemm_supported() const { return fp8_support_.ok(); }
  size_t workspace_bytes() const;  // of the scratch buffers, all together

 private:
  QuantScratch scratch_;
  // Fp8GemmSupport of the device (9.0 on the emulator unless a test lowers it:
  // simt::SetComputeCapability); what a product with fp8 activations returns when not ok.
  absl::Status fp8_support_ = absl::FailedPreconditionError("no device");
};

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
