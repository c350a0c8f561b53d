#include "engine/backends/backend_factory.h"

#include "absl/strings/str_cat.h"
#include "engine/backends/cuda_plugin_loader.h"
#include "engine/common/logging.h"
#include "engine/common/status_macros.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cuda/cuda_backend_factory.h"
#include "engine/model/model_weights.h"
#include "engine/weights/checkpoint.h"

namespace dcf {

bool CudaSimBackendBuilt() {
#if defined(DCF_HAVE_CUDA_SIM_BACKEND)
  return true;
#else
  return false;
#endif
}

bool CudaBackendBuilt() {
#if defined(DCF_HAVE_CUDA_BACKEND)
  return true;
#else
  return false;
#endif
}

int CudaDeviceCount() {
#if defined(DCF_HAVE_CUDA_BACKEND)
  // Asking loads the plugin and initialises the CUDA runtime (slow once); devices do not come
  // and go.
  static const int count = [] {
    absl::StatusOr<const CudaPlugin*> plugin = LoadCudaPlugin();
    if (!plugin.ok()) {
      DCF_LOG(Debug) << plugin.status();
      return 0;
    }
    return (*plugin)->device_count();
  }();
  return count;
#else
  return 0;
#endif
}

BackendKind ResolveBackendKind(BackendKind kind) {
  if (kind != BackendKind::kAuto) return kind;
  return CudaBackendBuilt() && CudaDeviceCount() > 0 ? BackendKind::kCuda : BackendKind::kCpu;
}

absl::StatusOr<LoadedModel> LoadModel(const std::string& dir, const BackendOptions& options) {
  const BackendKind kind = ResolveBackendKind(options.kind);
  // Refuse what cannot run before reading gigabytes of weights.
  if (kind == BackendKind::kCudaSim && !CudaSimBackendBuilt()) {
    return absl::UnavailableError(
        "--backend cuda-sim: this binary has no cuda-sim backend (the SIMT emulator is linked "
        "into the offline tools, the benchmarks and the tests, not into dcformer-server)");
  }
  if (kind == BackendKind::kCuda) {
    if (!CudaBackendBuilt()) {
      return absl::UnavailableError(
          "--backend cuda: this build has no CUDA backend (configure with the CUDA toolkit, "
          "DCFORMER_CUDA=ON)");
    }
#if defined(DCF_HAVE_CUDA_BACKEND)
    if (absl::StatusOr<const CudaPlugin*> p = LoadCudaPlugin(); !p.ok()) {
      return absl::UnavailableError(absl::StrCat("--backend cuda: ", p.status().message()));
    }
#endif
    if (CudaDeviceCount() == 0) {
      return absl::UnavailableError("--backend cuda: no CUDA device is visible");
    }
  }
  LoadedModel m;
  ASSIGN_OR_RETURN(m.config, ModelConfig::FromFile(dir + "/config.json"));
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, OpenCheckpointDir(dir));
  // The cpu backend keeps the checkpoint's dtype unless told otherwise (its kernels widen
  // 16-bit weights exactly, so parity with an fp32 conversion holds); --dtype converts
  // while reading.
  WeightLoadOptions load;
  // The CUDA backends convert tensor by tensor while uploading.
  load.dtype = kind == BackendKind::kCpu ? options.dtype : std::nullopt;
  load.check_finite = options.check_weights;
  ASSIGN_OR_RETURN(ModelWeights weights, LoadModelWeights(m.config, *reader, load));
  reader.reset();  // unmaps the files before the backend allocates anything
  DCF_LOG(Debug) << "loaded " << weights.NumParameters() << " parameters from " << dir;
  if (kind == BackendKind::kCpu) {
    ASSIGN_OR_RETURN(m.backend, CpuBackend::Create(m.config, std::move(weights), options.compose));
    return m;
  }
#if defined(DCF_HAVE_CUDA_SIM_BACKEND)
  if (kind == BackendKind::kCudaSim) {
    ASSIGN_OR_RETURN(m.backend, cuda::sim::CreateBackend(m.config, std::move(weights), options));
    return m;
  }
#endif
#if defined(DCF_HAVE_CUDA_BACKEND)
  ASSIGN_OR_RETURN(const CudaPlugin* plugin, LoadCudaPlugin());
  absl::Status status;
  Backend* backend = plugin->create_backend(&m.config, &weights, &options, &status);
  RETURN_IF_ERROR(status);
  m.backend.reset(backend);
#endif
  return m;
}

}  // namespace dcf
