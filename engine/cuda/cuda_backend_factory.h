// Plain C++ entry points to the two builds of the CUDA backend. The definitions live in
// cuda_backend_factory.cc inside `inline namespace DCF_CUDA_NS` (cuda_compat.h), i.e. in
// dcf::cuda::sim (the SIMT emulator build, which the backend factory in engine/backends links
// and calls directly) and dcf::cuda::gpu (the real build, called by the CUDA plugin,
// cuda_plugin.cc, which the factory loads with dlopen). No CUDA header is needed to include
// this.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/execution/backend.h"
#include "engine/execution/backend_options.h"
#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"

namespace dcf::cuda {

// `options`: dtype (bfloat16 when unset), device and compose; options.kind is not read.

namespace sim {
// Devices this build sees (the emulator always has one) and a backend on one of them.
int VisibleDeviceCount();
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const ModelConfig& config,
                                                       ModelWeights weights,
                                                       const BackendOptions& options);
}  // namespace sim

namespace gpu {
int VisibleDeviceCount();
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const ModelConfig& config,
                                                       ModelWeights weights,
                                                       const BackendOptions& options);
}  // namespace gpu

}  // namespace dcf::cuda
