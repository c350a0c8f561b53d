// Finds and loads the CUDA backend plugin (engine/cuda/cuda_plugin_abi.h) on first use.
// Thread-safe; the plugin stays loaded for the life of the process.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/cuda/cuda_plugin_abi.h"

namespace dcf {

struct CudaPlugin {
  DcfCudaPluginDeviceCountFn device_count = nullptr;
  DcfCudaPluginCreateBackendFn create_backend = nullptr;
};

// Looks for libdcformer_cuda_plugin.so at $DCF_CUDA_PLUGIN (a file), next to the executable's
// libraries (<exe dir>/../lib, <exe dir>/lib, <exe dir>), in the build tree it was built in,
// then on the loader's path. Unavailable naming every place tried when none loads (or one of
// another ABI version).
absl::StatusOr<const CudaPlugin*> LoadCudaPlugin();

}  // namespace dcf
