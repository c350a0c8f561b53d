#include "engine/backends/backend_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(std::string, backend, "auto",
          "model backend: auto (cuda when a GPU is visible, else cpu), cpu, cuda, or cuda-sim "
          "(the CUDA kernels on the host SIMT emulator; for testing)");
ABSL_FLAG(std::string, dtype, "",
          "dtype the weights are kept in: float32, bfloat16 or float16 (default: the "
          "checkpoint's dtype on cpu, which computes in float32 whatever the weights; "
          "bfloat16 on cuda and cuda-sim)");

ABSL_FLAG(std::string, kv_cache_dtype, "",
          "dtype of the KV cache's elements: float32, bfloat16 or float16 (default: float32 on "
          "cpu; on cuda and cuda-sim the --dtype, the only one they support). A 16-bit cache "
          "holds twice the tokens in the same memory; attention still computes in float32");

ABSL_FLAG(bool, check_weights, false,
          "scan the weights for NaN and infinity while loading them (one pass over the "
          "weights); a checkpoint that holds any is refused, naming the tensor");

ABSL_FLAG(std::string, weight_dtype, "none",
          "none, int8 or fp8: quantize the weight matrices at load (weight-only; vectors, the "
          "embedding table and the compose matrices keep --dtype). cpu: int8, symmetric, one "
          "bf16 scale per --weight-group-size input columns. cuda and cuda-sim: int8 or fp8 "
          "E4M3, one scale per output channel (docs/QUANTIZATION.md); fp8 is refused on cpu");
ABSL_FLAG(int32_t, weight_group_size, dcf::kDefaultWeightGroupSize,
          "input columns per scale of --weight-dtype int8 on the cpu backend: 32, 64 or 128 "
          "(cuda and cuda-sim scale per output channel and do not read it)");

ABSL_FLAG(std::string, activation_dtype, "float32",
          "float32 (also f32, fp32), int8 or fp8. int8 (cpu only): the int8 matrices "
          "(--weight-dtype int8, or an int8 checkpoint) also quantize their inputs per row and "
          "weight group and multiply int8 x int8 (AVX-512 VNNI where the CPU has it). fp8 "
          "(cuda and cuda-sim, with --weight-dtype fp8; refused on a GPU below compute "
          "capability 8.9): products of more than 16 rows quantize their inputs to fp8 E4M3 "
          "per row and run cuBLASLt's FP8 GEMM. docs/QUANTIZATION.md");

namespace dcf {

absl::StatusOr<BackendOptions> BackendOptionsFromFlags() {
  BackendOptions o;
  absl::StatusOr<BackendKind> kind = ParseBackendKind(absl::GetFlag(FLAGS_backend));
  if (!kind.ok()) return absl::InvalidArgumentError(absl::StrCat("--backend: ", kind.status().message()));
  o.kind = *kind;
  o.check_weights = absl::GetFlag(FLAGS_check_weights);
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (!dtype.empty()) {
    absl::StatusOr<DType> d = ParseComputeDType(dtype);
    if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat("--dtype: ", d.status().message()));
    o.dtype = *d;
  }
  absl::StatusOr<WeightQuant> quant = ParseWeightQuant(absl::GetFlag(FLAGS_weight_dtype));
  if (!quant.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--weight-dtype: ", quant.status().message()));
  }
  o.weight_quant = *quant;
  absl::StatusOr<ActivationQuant> act =
      ParseActivationQuant(absl::GetFlag(FLAGS_activation_dtype));
  if (!act.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--activation-dtype: ", act.status().message()));
  }
  o.activation_quant = *act;
  o.weight_group_size = absl::GetFlag(FLAGS_weight_group_size);
  if (absl::Status s = ValidateWeightGroupSize(o.weight_group_size); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--weight-group-size: ", s.message()));
  }
  const std::string kv_dtype = absl::GetFlag(FLAGS_kv_cache_dtype);
  if (!kv_dtype.empty()) {
    absl::StatusOr<DType> d = ParseComputeDType(kv_dtype);
    if (!d.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--kv-cache-dtype: ", d.status().message()));
    }
    o.kv_cache_dtype = *d;
  }
  return o;
}

}  // namespace dcf
