// The skinny GEMM of decode steps: the same product as Gemm::Linear (gemm.h)
//   y[M, N] (f32) = x[M, K] . w[N, K]^T  (+ bias[N]) (+ y when accumulating)
// for M <= kGemvMaxRows, where a decode step is bound by streaming the weights: each weight
// row is read from memory once for all M rows of x (x, at most 16 x K, stays in L1/L2).
//
// Layout: blocks of 8 warps; a block owns R output features (R = 8, 4, 2 or 1, the largest
// that still gives >= 264 blocks, two waves of an H200's 132 SMs) and the 8 / R warps of a
// feature split K among them (split-K inside the block: lanes stride K in 16-byte vectors,
// kGemvUnroll vectors in flight per lane), summed in a fixed order (lanes by a butterfly,
// then warps in warp order), so a result is the same run after run and does not depend on M:
// row m of a batch equals the product of row m alone. f32 accumulation; 16-bit inputs are
// widened exactly. The epilogue adds the bias and, when accumulating, y (the residual add of
// the output projections).
//
// Epilogue kSwiGlu (the dcformer MLP's [w1 | w3] product): w has 2 * n_out rows and the
// block computes rows j (gate) and n_out + j (up) of each feature j it owns; instead of y it
// writes act[m, j] = silu(g) * u in act_type (the input of the down projection), as
// LaunchActivation's kSwiGlu computes it from the f32 product.
//
// Prologue (GemvIn::norm_weight set; dcformer's RMSNorm folded into the next product): x is
// the f32 residual stream [M, K] (a.x, a.ldx; a.dtype still names the weights' and the
// normalised input's type). Every block first computes each row's 1 / sqrt(mean(x^2) + eps)
// exactly as NormKernel does (f64 sum over 256 threads in the same order), then multiplies
// by FromFloat<T>(x * inv * norm_weight), the very value NormKernel would have written, so
// LaunchNorm then LaunchGemv and the fused call agree bit for bit and the decode layer saves
// a kernel and the round trip of the normalised row.
//
// GemvIn::row_index gathers x's rows (any prologue): row m of the product is that of x's row
// row_index[m], so the final norm of the rows that need logits is the logits GEMV's prologue
// as NormParams::row_index made it the norm kernel's gather.
//
// With GemvIn::layer_norm (dcpythia) the prologue is NormKernel's LayerNorm instead: each
// row's mean and 1 / sqrt(var + eps) in f64 (two sums over 256 threads, in NormKernel's
// order), then FromFloat<T>(fmaf(float((x - mean) * inv), norm_weight, norm_bias or 0)), again
// the value NormKernel writes. Epilogue kGelu writes LaunchActivation's kGelu of the f32
// product (+ bias) in act_type: a dcpythia decode layer's MLP input is one GEMV.
//
// Quantized weights (GemmArgs::wtype kI8 / kFp8 with w_scale, docs/QUANTIZATION.md "GPU"):
// the same layout and order of sums, each lane loading 8 one-byte codes (8 bytes) per slice
// and decoding them exactly to f32 (8 slices in flight instead of 4: the same bytes), x and
// the accumulation as above; the epilogue multiplies the finished f32 sum S by the output
// channel's scale, rounded on its own (__fmul_rn), before the bias: v = S * w_scale[n] +
// bias[n], then y = v or y + v, or SwiGLU / GELU of v. So the quantized GEMV is bit for bit
// the f32 GEMV of the codes' values followed by that epilogue (gemv_quant_test). The kernel
// is gemv_kernel.cuh, instantiated per weight storage in gemv.cu, gemv_int8.cu and
// gemv_fp8.cu. GemmArgs::fp8_activations is read by the library path only: the GEMV of
// such a product is weight-only (the decode steps of --activation-dtype fp8).
#pragma once

#include <cstdint>

#include "engine/simt/cuda_compat.h"
#include "engine/cuda/dcmha_attention.h"
#include "engine/cuda/gemm.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {

inline constexpr int kGemvMaxRows = 16;
inline constexpr int kGemvUnroll = 4;

enum class GemvEpilogue {
  kLinear,  // y = (or +=) x . w^T + bias, as GemmArgs says
  kSwiGlu,  // act = silu(x . w[0:n)^T + b[0:n)) * (x . w[n:2n)^T + b[n:2n)); GemmArgs::n = 2n
  kGelu,    // act = gelu_erf(x . w^T + bias) (the dcpythia MLP's w1 product); no y, no accumulate
};

struct GemvOut {
  GemvEpilogue epilogue = GemvEpilogue::kLinear;
  void* act = nullptr;  // kSwiGlu: [M, n/2], kGelu: [M, n] of act_type, rows act_ld apart
  ElemType act_type = ElemType::kF32;
  int64_t act_ld = 0;
};

struct GemvIn {
  const float* norm_weight = nullptr;  // [K] f32; null: x is the product's input as it is
  bool layer_norm = false;             // LayerNorm (dcpythia) instead of RMSNorm
  const float* norm_bias = nullptr;    // [K] f32 or null (LayerNorm only)
  double eps = 1e-6;
  // [M] or null: row m of the product reads row row_index[m] of x (NormParams::row_index's
  // gather: the final norm of the rows that need logits folded into the logits GEMV).
  const int32_t* row_index = nullptr;
};

// Whether LaunchGemv takes `a`: 1 <= m <= kGemvMaxRows and well-formed (ValidateGemmArgs);
// quantized weights also need every row of x and w 16-byte aligned (K and ldx multiples of 8:
// every model shape here), else the library path takes them (gemm_quant.h).
bool GemvHandles(const GemmArgs& a);

// Enqueues the product. cudaErrorInvalidValue for arguments GemvHandles refuses (and for
// quantized weights with a norm weight or bias that is not 16-byte aligned), a kSwiGlu
// epilogue with an odd n, no act buffer, act_ld < n / 2 or a LayerNorm prologue (no model has
// both), or a kGelu one with no act buffer, act_ld < n or accumulation (a.y is not written by
// either).
cudaError_t LaunchGemv(const GemmArgs& a, const GemvOut& out, const GemvIn& in,
                       cudaStream_t stream);
inline cudaError_t LaunchGemv(const GemmArgs& a, const GemvOut& out, cudaStream_t stream) {
  return LaunchGemv(a, out, GemvIn{}, stream);
}
inline cudaError_t LaunchGemv(const GemmArgs& a, cudaStream_t stream) {
  return LaunchGemv(a, GemvOut{}, GemvIn{}, stream);
}

// The layout chosen for n output features: features per block (R above) and blocks.
struct GemvGrid {
  int features_per_block;
  int blocks;
};
GemvGrid GemvGridFor(int n);

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
