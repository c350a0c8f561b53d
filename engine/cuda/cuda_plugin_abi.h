// The interface between the backend factory and the CUDA backend plugin
// (libdcformer_cuda_plugin.so, engine/cuda/cuda_plugin.cc). Plain C++: the factory includes
// it without any CUDA header. Both sides are built from the same tree by the same compiler;
// the version guards against loading a plugin from another build.
#pragma once

#include "absl/status/status.h"
#include "engine/cuda/cuda_backend_factory.h"
#include "engine/execution/backend.h"
#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"

// Bump when a signature below or a type crossing the boundary changes.
#define DCF_CUDA_PLUGIN_ABI_VERSION 8
#define DCF_CUDA_PLUGIN_FILE "libdcformer_cuda_plugin.so"

extern "C" {
// DCF_CUDA_PLUGIN_ABI_VERSION of the plugin.
using DcfCudaPluginAbiVersionFn = int (*)();
// CUDA devices visible; 0 without a driver or device, with *error naming the CUDA error
// (cuda::DeviceCountError).
using DcfCudaPluginDeviceCountFn = int (*)(absl::Status* error);
// A backend on options->device built from `weights` (moved from), or null with `status` set.
// The caller owns the result (delete through Backend's virtual destructor).
using DcfCudaPluginCreateBackendFn =
    dcf::Backend* (*)(const dcf::ModelConfig* config, dcf::ModelWeights* weights,
                      const dcf::BackendOptions* options, absl::Status* status);
}
