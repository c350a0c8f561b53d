// What a caller chooses about a backend: which one (cpu, cuda, cuda-sim, or auto), the dtype
// its weights are kept in, the device, and whether DCMHA composes. One struct for every
// backend and for the factory that builds them (engine/backends/backend_factory.h), with the
// names the --backend and --dtype flags accept. Pure functions, thread-safe.
#pragma once

#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/weights/dtype.h"

namespace dcf {

enum class BackendKind {
  kAuto,     // cuda when this build has it and a device is visible, else cpu
  kCpu,      // the host: fp32 math, weights in the checkpoint's dtype (the oracle)
  kCuda,     // NVIDIA GPU
  kCudaSim,  // the CUDA backend's kernels on the host SIMT emulator (docs/CUDA_SIM.md)
};

// "auto", "cpu", "cuda", "cuda-sim" (InvalidArgument naming the choices otherwise).
absl::StatusOr<BackendKind> ParseBackendKind(absl::string_view name);
const char* BackendKindName(BackendKind kind);

// "float32" | "bfloat16" | "float16" (also "f32", "bf16", "f16"; InvalidArgument otherwise).
absl::StatusOr<DType> ParseComputeDType(absl::string_view name);
const char* ComputeDTypeName(DType dtype);  // "float32", "bfloat16", "float16"

// How the weight matrices are stored beyond the --dtype choice (docs/QUANTIZATION.md).
enum class WeightQuant {
  kNone,  // as --dtype says
  // int8 weight-only, symmetric: on the cpu per group of input columns with bf16 scales; on
  // cuda and cuda-sim per output channel (the same rule with one group per row)
  kInt8,
  kFp8,  // fp8 E4M3, one fp32 scale per output channel (cuda and cuda-sim only)
};
// "none" | "int8" | "fp8" (InvalidArgument otherwise).
absl::StatusOr<WeightQuant> ParseWeightQuant(absl::string_view name);
const char* WeightQuantName(WeightQuant quant);  // "none", "int8", "fp8"
// What the int8 matrices' products multiply their weights with (docs/QUANTIZATION.md).
enum class ActivationQuant {
  kFloat32,  // activations as computed, quantized weights widened in the kernel (weight-only)
  kInt8,     // activations quantized per row and weight group (int8 x int8, VNNI on AVX-512)
  // fp8 weights on cuda / cuda-sim: products of more than 16 rows quantize their activations
  // to E4M3 per row and run cuBLASLt's FP8 GEMM (compute capability 8.9 or later)
  kFp8,
};
// "float32" | "int8" | "fp8" (InvalidArgument otherwise).
absl::StatusOr<ActivationQuant> ParseActivationQuant(absl::string_view name);
const char* ActivationQuantName(ActivationQuant quant);  // "float32", "int8", "fp8"

// Group sizes of int8 weights: 32, 64 or 128 input columns share one scale.
inline constexpr int kDefaultWeightGroupSize = 64;
// InvalidArgument naming the choices unless `group` is 32, 64 or 128.
absl::Status ValidateWeightGroupSize(int group);

struct BackendOptions {
  BackendKind kind = BackendKind::kAuto;
  // The dtype weights are kept in; nullopt: the backend's default (cpu: the checkpoint's
  // own dtype, F32, F16 or BF16; cuda and cuda-sim: bfloat16). The cpu backend always
  // multiplies in fp32 (16-bit weights are widened inside its kernels).
  std::optional<DType> dtype;
  // The dtype of the KV cache's elements; nullopt: the backend's default (cpu: float32, the
  // oracle's; cuda and cuda-sim: the weights' dtype, the only one they support). The cpu
  // backend also keeps bfloat16 or float16 (half the bytes per token, so twice the tokens in
  // the same memory), rounding a step's fresh rows as it stores them.
  std::optional<DType> kv_cache_dtype;
  int device = 0;  // CUDA device ordinal
  // false: skip the DCMHA compose (plain multi-head attention with the same weights and
  // cache). Only for benchmarks that price DCMHA against MHA; the output is not the model's.
  bool compose = true;
  // Scan the weights for NaN and infinity while loading them (one pass; the factory refuses
  // a checkpoint that holds any, naming the tensor). Off by default.
  bool check_weights = false;
  // kInt8: every matrix is quantized at load (vectors, the embedding table and the small
  // compose matrices qkw keep their dtype): on the cpu in groups of `weight_group_size`
  // columns, on cuda and cuda-sim per output channel (weight_group_size is not read there).
  // kFp8: E4M3 per output channel, cuda and cuda-sim only (the factory refuses it on the
  // cpu). docs/QUANTIZATION.md.
  WeightQuant weight_quant = WeightQuant::kNone;
  int weight_group_size = kDefaultWeightGroupSize;
  // kInt8: the int8 matrices (weight_quant kInt8, or an int8 checkpoint) also quantize their
  // activations (cpu only; the factory refuses it without int8 matrices). kFp8: the fp8
  // matrices' products of more than 16 rows quantize their activations too (cuda and
  // cuda-sim with weight_quant kFp8 only; the cuda backend refuses it below compute
  // capability 8.9).
  ActivationQuant activation_quant = ActivationQuant::kFloat32;
};

// Whether `kind` (cpu, cuda or cuda-sim) runs the weight and activation dtypes `options`
// asks for (docs/QUANTIZATION.md): OK, or InvalidArgument naming the flag and what runs it.
// The cpu backend takes --weight-dtype int8 (per group) and --activation-dtype int8; cuda
// and cuda-sim take --weight-dtype int8 or fp8 (per output channel) and, with fp8 weights,
// --activation-dtype fp8. The one rule: LoadModel (engine/backends) calls it before reading
// the weights, and CudaBackend::Create with its own kind, for callers that build the backend
// directly. The device's own limit (fp8 activations below compute capability 8.9) is the
// cuda backend's to refuse (engine/cuda/gemm_quant.h, Fp8GemmSupport).
absl::Status CheckQuantization(BackendKind kind, const BackendOptions& options);

}  // namespace dcf
