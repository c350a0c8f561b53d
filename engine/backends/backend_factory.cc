#include "engine/backends/backend_factory.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "engine/common/logging.h"
#include "engine/common/status_macros.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/model/model_weights.h"
#include "engine/weights/checkpoint.h"

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
    case BackendKind::kAuto: return "auto";
    case BackendKind::kCpu: return "cpu";
    case BackendKind::kCuda: return "cuda";
    case BackendKind::kCudaSim: return "cuda-sim";
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
    case DType::kF32: return "float32";
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
  }
  return "?";
}

bool CudaBackendBuilt() { return false; }
int CudaDeviceCount() { return 0; }

BackendKind ResolveBackendKind(BackendKind kind) {
  if (kind != BackendKind::kAuto) return kind;
  return CudaBackendBuilt() && CudaDeviceCount() > 0 ? BackendKind::kCuda : BackendKind::kCpu;
}

absl::StatusOr<LoadedModel> LoadModel(const std::string& dir, const BackendOptions& options) {
  const BackendKind kind = ResolveBackendKind(options.kind);
  // Refuse what cannot run before reading gigabytes of weights.
  if (kind == BackendKind::kCuda) {
    return absl::UnavailableError(
        CudaBackendBuilt() ? "--backend cuda: no CUDA device is visible"
                           : "--backend cuda: this build has no CUDA backend (configure with "
                             "the CUDA toolkit, DCFORMER_CUDA=ON)");
  }
  if (kind == BackendKind::kCudaSim) {
    return absl::UnimplementedError("--backend cuda-sim: not available in this build");
  }
  LoadedModel m;
  ASSIGN_OR_RETURN(m.config, ModelConfig::FromFile(dir + "/config.json"));
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, OpenCheckpointDir(dir));
  // The cpu backend keeps the checkpoint's dtype unless told otherwise (its kernels widen
  // 16-bit weights exactly, so parity with an fp32 conversion holds); --dtype converts
  // while reading.
  WeightLoadOptions load;
  load.dtype = options.dtype;
  ASSIGN_OR_RETURN(ModelWeights weights, LoadModelWeights(m.config, *reader, load));
  reader.reset();  // unmaps the files before the backend allocates anything
  DCF_LOG(Debug) << "loaded " << weights.NumParameters() << " parameters from " << dir;
  ASSIGN_OR_RETURN(m.backend, CpuBackend::Create(m.config, std::move(weights), options.compose));
  return m;
}

}  // namespace dcf
