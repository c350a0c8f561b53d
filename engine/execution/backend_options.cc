#include "engine/execution/backend_options.h"

#include "engine/execution/backend.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"

namespace dcf {

absl::StatusOr<BackendKind> ParseBackendKind(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "auto") return BackendKind::kAuto;
  if (n == "cpu") return BackendKind::kCpu;
  if (n == "cuda") return BackendKind::kCuda;
  if (n == "cuda-sim" || n == "cuda_sim") return BackendKind::kCudaSim;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown backend '", name, "' (choose auto, cpu, cuda or cuda-sim)"));
}

const char* BackendKindName(BackendKind kind) {
  switch (kind) {
    case BackendKind::kAuto:
      return "auto";
    case BackendKind::kCpu:
      return "cpu";
    case BackendKind::kCuda:
      return "cuda";
    case BackendKind::kCudaSim:
      return "cuda-sim";
  }
  return "?";
}

absl::StatusOr<DType> ParseComputeDType(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "float32" || n == "f32" || n == "fp32") return DType::kF32;
  if (n == "bfloat16" || n == "bf16") return DType::kBF16;
  if (n == "float16" || n == "f16" || n == "fp16" || n == "half") return DType::kF16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name, "' (choose float32, bfloat16 or float16)"));
}

const char* ComputeDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "float32";
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    case DType::kI8:
      return "int8";
  }
  return "?";
}

absl::StatusOr<WeightQuant> ParseWeightQuant(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "none") return WeightQuant::kNone;
  if (n == "int8") return WeightQuant::kInt8;
  if (n == "fp8" || n == "fp8_e4m3" || n == "e4m3") return WeightQuant::kFp8;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown weight dtype '", name, "' (choose none, int8 or fp8)"));
}

const char* WeightQuantName(WeightQuant quant) {
  switch (quant) {
    case WeightQuant::kNone:
      return "none";
    case WeightQuant::kInt8:
      return "int8";
    case WeightQuant::kFp8:
      return "fp8";
  }
  return "?";
}

std::string WeightsName(const BackendInfo& info) {
  if (info.channel_quant != WeightQuant::kNone) {
    return absl::StrCat(WeightQuantName(info.channel_quant),
                        info.fp8_activations ? " x fp8" : "", " (per channel)");
  }
  if (info.int8_weight_group > 0) {
    return absl::StrCat(info.int8_activations ? "int8 x int8" : "int8", " (group ",
                        info.int8_weight_group, ")");
  }
  return ComputeDTypeName(info.dtype);
}

absl::StatusOr<ActivationQuant> ParseActivationQuant(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "float32" || n == "f32" || n == "fp32") return ActivationQuant::kFloat32;
  if (n == "int8") return ActivationQuant::kInt8;
  if (n == "fp8" || n == "fp8_e4m3" || n == "e4m3") return ActivationQuant::kFp8;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown activation dtype '", name, "' (choose float32, int8 or fp8)"));
}

const char* ActivationQuantName(ActivationQuant quant) {
  switch (quant) {
    case ActivationQuant::kFloat32:
      return "float32";
    case ActivationQuant::kInt8:
      return "int8";
    case ActivationQuant::kFp8:
      return "fp8";
  }
  return "?";
}

absl::Status ValidateWeightGroupSize(int group) {
  if (group == 32 || group == 64 || group == 128) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("weight group size ", group, " is not supported (choose 32, 64 or 128)"));
}

absl::Status CheckQuantization(BackendKind kind, const BackendOptions& options) {
  const bool cpu = kind == BackendKind::kCpu;
  switch (options.weight_quant) {
    case WeightQuant::kNone:
      break;
    case WeightQuant::kInt8:
      if (cpu) RETURN_IF_ERROR(ValidateWeightGroupSize(options.weight_group_size));
      break;
    case WeightQuant::kFp8:
      if (cpu) {
        return absl::InvalidArgumentError(
            "--weight-dtype fp8: the cpu backend has no fp8 kernels (fp8 E4M3 weights run on "
            "--backend cuda or cuda-sim; the cpu backend takes --weight-dtype int8)");
      }
      break;
  }
  switch (options.activation_quant) {
    case ActivationQuant::kFloat32:
      break;
    case ActivationQuant::kInt8:
      if (!cpu) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--activation-dtype int8: the ", BackendKindName(kind),
            " backend has no int8 x int8 kernels (only --backend cpu runs them; with "
            "--weight-dtype fp8 it takes --activation-dtype fp8)"));
      }
      break;
    case ActivationQuant::kFp8:
      if (cpu) {
        return absl::InvalidArgumentError(
            "--activation-dtype fp8: the cpu backend has no fp8 kernels (it runs on --backend "
            "cuda or cuda-sim with --weight-dtype fp8; the cpu backend takes "
            "--activation-dtype int8 with --weight-dtype int8)");
      }
      if (options.weight_quant != WeightQuant::kFp8) {
        return absl::InvalidArgumentError(
            "--activation-dtype fp8 multiplies fp8 weights: give --weight-dtype fp8");
      }
      break;
  }
  return absl::OkStatus();
}

}  // namespace dcf
