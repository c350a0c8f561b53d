// Chooses and builds a backend for a model directory: the one place that knows every
// backend (cpu, cuda, cuda-sim). Tools, the server and the benchmarks load models through
// it (--backend, --dtype). cuda-sim is there only in binaries that link
// dcformer_backends_sim (engine/backends/CMakeLists.txt).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/execution/backend.h"
#include "engine/execution/backend_options.h"
#include "engine/weights/dtype.h"

namespace dcf {

// Whether this binary has the cuda-sim backend: linked with dcformer_backends_sim (tools,
// benchmarks, tests), not with dcformer_backends (release dcformer-server).
bool CudaSimBackendBuilt();

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
