#include "engine/backends/backend_factory.h"

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
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

namespace {

#if defined(DCF_HAVE_CUDA_BACKEND)
// Whether the plugin loads and how many devices it sees, asked once: loading the plugin
// initialises the CUDA runtime (slow once), and devices do not come and go.
struct CudaProbe {
  absl::Status plugin;
  int devices = 0;
  absl::Status device_error;  // why devices is 0: the CUDA error (cuda::DeviceCountError)
};
const CudaProbe& ProbeCuda() {
  static const CudaProbe* const probe = [] {
    auto* p = new CudaProbe;
    absl::StatusOr<const CudaPlugin*> plugin = LoadCudaPlugin();
    p->plugin = plugin.status();
    if (plugin.ok()) p->devices = (*plugin)->device_count(&p->device_error);
    return p;
  }();
  return *probe;
}
#endif

const char* EnvOrUnset(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? "(unset)" : v;
}

// Why the plugin sees no device: the CUDA error (an old driver, no driver, no device), and
// the variables that decide which GPUs a process sees.
std::string NoCudaDeviceReason(const absl::Status& device_error) {
  return absl::StrCat(
      "no CUDA device is usable: ",
      device_error.ok() ? "cudaGetDeviceCount found none" : device_error.message(),
      " (CUDA_VISIBLE_DEVICES=", EnvOrUnset("CUDA_VISIBLE_DEVICES"),
      ", NVIDIA_VISIBLE_DEVICES=", EnvOrUnset("NVIDIA_VISIBLE_DEVICES"), ")");
}

}  // namespace

int CudaDeviceCount() {
#if defined(DCF_HAVE_CUDA_BACKEND)
  return ProbeCuda().devices;
#else
  return 0;
#endif
}

AutoBackendChoice ChooseAutoBackend(bool cuda_built, const absl::Status& plugin,
                                    int device_count, const absl::Status& device_error) {
  AutoBackendChoice c;
  if (!cuda_built) {
    c.reason = "this build has no CUDA backend (configured without the CUDA toolkit)";
    return c;
  }
  c.fallback = true;
  if (!plugin.ok()) {
    // The loader lists each place it tried with its dlerror, one per line: one log line.
    c.reason = absl::StrCat("the CUDA backend plugin did not load: ",
                            absl::StrReplaceAll(plugin.message(), {{"\n  ", " | "}}));
    return c;
  }
  if (device_count <= 0) {
    c.reason = absl::StrCat("the CUDA backend plugin loaded but ",
                            NoCudaDeviceReason(device_error));
    return c;
  }
  c.kind = BackendKind::kCuda;
  c.fallback = false;
  c.reason = absl::StrCat(device_count, " CUDA device(s) visible");
  return c;
}

AutoBackendChoice ChooseAutoBackend() {
#if defined(DCF_HAVE_CUDA_BACKEND)
  const CudaProbe& probe = ProbeCuda();
  return ChooseAutoBackend(true, probe.plugin, probe.devices, probe.device_error);
#else
  return ChooseAutoBackend(false, absl::OkStatus(), 0);
#endif
}

BackendKind ResolveBackendKind(BackendKind kind) {
  return kind == BackendKind::kAuto ? ChooseAutoBackend().kind : kind;
}

absl::StatusOr<LoadedModel> LoadModel(const std::string& dir, const BackendOptions& options) {
  BackendKind kind = options.kind;
  if (kind == BackendKind::kAuto) {
    // Loudly: a GPU deployment that fell back to the CPU must show in its log.
    const AutoBackendChoice choice = ChooseAutoBackend();
    kind = choice.kind;
    if (choice.fallback) {
      DCF_LOG(Warning) << "--backend auto: falling back to the cpu backend: " << choice.reason
                       << " (--backend cuda fails instead)";
    } else {
      DCF_LOG(Info) << "--backend auto: " << BackendKindName(kind) << " (" << choice.reason
                    << ")";
    }
  }
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
    if (CudaDeviceCount() == 0) {
      return absl::UnavailableError(
          absl::StrCat("--backend cuda: ", NoCudaDeviceReason(ProbeCuda().device_error)));
    }
#endif
  }
  RETURN_IF_ERROR(CheckQuantization(kind, options));
  LoadedModel m;
  ASSIGN_OR_RETURN(m.config, ModelConfig::FromFile(dir + "/config.json"));
  if (options.activation_quant == ActivationQuant::kInt8) {
    if (options.weight_quant != WeightQuant::kInt8 && m.config.int8_group_size == 0) {
      return absl::InvalidArgumentError(
          "--activation-dtype int8 multiplies int8 weights: give --weight-dtype int8 (or load "
          "an int8 checkpoint from dcformer-quantize)");
    }
  }
  if (m.config.int8_group_size > 0 && kind != BackendKind::kCpu) {
    // The GPU kernels scale per output channel (a multiply in the epilogue), the checkpoint
    // per group of G columns: its scales cannot be applied without changing the kernels'
    // summation, and re-quantizing would round twice.
    return absl::InvalidArgumentError(absl::StrCat(
        dir, " holds an int8 checkpoint with one scale per ", m.config.int8_group_size,
        " columns (config.json quantization_config): the ", BackendKindName(kind),
        " backend's int8 kernels take one scale per output channel; load the float "
        "checkpoint with --weight-dtype int8 instead, or use --backend cpu"));
  }
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
    CpuBackendOptions cpu;
    cpu.compose = options.compose;
    cpu.int8.group = options.weight_quant == WeightQuant::kInt8 ? options.weight_group_size : 0;
    cpu.int8.activations = options.activation_quant == ActivationQuant::kInt8;
    cpu.kv_cache_dtype = options.kv_cache_dtype.value_or(DType::kF32);
    ASSIGN_OR_RETURN(m.backend, CpuBackend::Create(m.config, std::move(weights), cpu));
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
