// Plain C++ entry points to the two builds of the CUDA backend. The definitions live in
// cuda_backend_factory.cc inside `inline namespace DCF_CUDA_NS` (cuda_compat.h), i.e. in
// dcf::cuda::sim (the SIMT emulator build, which the backend factory in engine/backends links
// and calls directly) and dcf::cuda::gpu (the real build, called by the CUDA plugin,
// cuda_plugin.cc, which the factory loads with dlopen). No CUDA header is needed to include
// this.
#pragma once

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/execution/backend.h"
#include "engine/execution/backend_options.h"
#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"

namespace dcf::cuda {

// `options`: dtype (bfloat16 when unset), device and compose; options.kind is not read.

// Why no CUDA device can be used, from what cudaGetDeviceCount returned (the cudaError_t's
// code, name and description) and, for a driver problem, the driver's CUDA version
// (cudaDriverGetVersion: 0 when no driver loaded) and this build's runtime version (both
// 1000 * major + 10 * minor; 0 when unknown). Unavailable, naming the error and, for the
// errors a deployment meets (no driver, a driver older than the runtime, no device), what to
// do. Plain C++, so the factory and its tests use it without a CUDA header.
inline absl::Status DeviceCountError(int code, const char* name, const char* description,
                                     int driver_version, int runtime_version) {
  auto version = [](int v) {
    return v <= 0 ? std::string("unknown") : absl::StrCat(v / 1000, ".", (v % 1000) / 10);
  };
  std::string hint;
  if (code == 35) {  // cudaErrorInsufficientDriver
    hint = driver_version <= 0
               ? "no NVIDIA driver was found (libcuda.so.1 did not load): not a GPU node, or "
                 "the container runtime did not mount the driver (NVIDIA container runtime: "
                 "runtimeClassName nvidia, docker --gpus)"
               : absl::StrCat("the NVIDIA driver supports CUDA ", version(driver_version),
                              ", older than this build's CUDA runtime ", version(runtime_version),
                              ": upgrade the driver (CUDA 13 needs the R580 branch or newer)");
  } else if (code == 100) {  // cudaErrorNoDevice
    hint = "the driver sees no GPU: none was given to this process (nvidia.com/gpu, docker "
           "--gpus) or CUDA_VISIBLE_DEVICES hides them";
  }
  return absl::UnavailableError(absl::StrCat("cudaGetDeviceCount: ", name ? name : "?", " (",
                                             code, "): ", description ? description : "",
                                             hint.empty() ? "" : "; ", hint));
}

// VisibleDeviceCount: the devices this build sees (the emulator always has one); 0 with
// *error (when given) set to DeviceCountError when cudaGetDeviceCount fails.
namespace sim {
// Devices this build sees and a backend on one of them.
int VisibleDeviceCount(absl::Status* error = nullptr);
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const ModelConfig& config,
                                                       ModelWeights weights,
                                                       const BackendOptions& options);
}  // namespace sim

namespace gpu {
int VisibleDeviceCount(absl::Status* error = nullptr);
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const ModelConfig& config,
                                                       ModelWeights weights,
                                                       const BackendOptions& options);
}  // namespace gpu

}  // namespace dcf::cuda
