// Chooses and builds a backend for a model directory: the one place that knows every
// backend (cpu, cuda, cuda-sim). Tools, the server and the benchmarks load models through
// it (--backend, --dtype).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/model/backend.h"
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

struct BackendOptions {
  BackendKind kind = BackendKind::kAuto;
  // The dtype weights are kept in; nullopt: the backend's default (cpu: the checkpoint's
  // own dtype, F32, F16 or BF16; cuda and cuda-sim: bfloat16). The cpu backend always
  // multiplies in fp32 (16-bit weights are widened inside its kernels).
  std::optional<DType> dtype;
  int device = 0;  // CUDA device ordinal
  // false: skip the DCMHA compose (plain multi-head attention with the same weights and
  // cache). Only for benchmarks that price DCMHA against MHA; the output is not the model's.
  bool compose = true;
};

// Whether this build contains the real CUDA backend, and how many devices it sees (0 when
// not built or no driver/device).
bool CudaBackendBuilt();
int CudaDeviceCount();

// The backend `kind` resolves to on this machine (kAuto becomes kCuda or kCpu).
BackendKind ResolveBackendKind(BackendKind kind);

// What --backend auto chose and why, for the log: a GPU image that silently runs on the CPU
// is a production failure, so LoadModel logs this at INFO (cuda chosen, or a build without
// CUDA) or WARNING (a CUDA build that falls back to the CPU: the plugin's dlerror, or the CUDA
// error that left no device usable, e.g. an NVIDIA driver older than the runtime).
struct AutoBackendChoice {
  BackendKind kind = BackendKind::kCpu;
  bool fallback = false;  // a CUDA build chose the CPU: worth a WARNING
  std::string reason;
};
// The choice from what was found: whether this build has the CUDA backend, the plugin's load
// status (ignored when not built), the visible devices and, when there are none, the CUDA
// error that says why (cuda::DeviceCountError). ChooseAutoBackend() asks this machine
// (loading the plugin once).
AutoBackendChoice ChooseAutoBackend(bool cuda_built, const absl::Status& plugin,
                                    int device_count,
                                    const absl::Status& device_error = absl::OkStatus());
AutoBackendChoice ChooseAutoBackend();

struct LoadedModel {
  ModelConfig config;
  std::unique_ptr<Backend> backend;
};

// Parses `dir`/config.json, validates and loads the weights (LoadModelWeights) and builds
// the chosen backend. Errors name the file, key, tensor or option at fault; Unavailable when
// the chosen backend cannot run here (e.g. cuda without a device).
absl::StatusOr<LoadedModel> LoadModel(const std::string& dir, const BackendOptions& options = {});

}  // namespace dcf
