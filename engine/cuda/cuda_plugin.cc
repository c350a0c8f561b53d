// The real CUDA backend as a plugin: libdcformer_cuda_plugin.so, which the backend factory
// loads with dlopen (engine/backends/cuda_plugin_loader.h) only when a tool asks for
// --backend cuda or auto.
//
// Why a plugin: the CUDA runtime (linked statically, as the GPU bundle needs) brings static
// TLS that every thread of a binary linking it pays for in its stack. dcformer-server's
// metrics endpoint (civetweb, fixed 100 KiB thread stacks, already two thirds taken by
// OpenBLAS's TLS) then overflowed its worker stacks. A dlopen'ed library's TLS is allocated
// per thread on first use instead. Binaries also start where no CUDA is installed.
//
// Only the extern "C" functions below are exported (version script): the plugin carries its
// own copy of the engine core it was linked with, built from the same sources as the host
// binary; objects cross the boundary by reference (ModelConfig, ModelWeights, Backend).
//
// No exception leaves an entry point: each one turns whatever is thrown into a Status
// (std::bad_alloc into ResourceExhausted), since an exception crossing the C boundary would
// terminate the process that loaded the plugin.
#include <exception>
#include <new>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_backend.h"
// Must come after cuda_backend.h (see cuda_backend_factory.cc).
#include "engine/cuda/cuda_backend_factory.h"
#include "engine/cuda/cuda_plugin_abi.h"

namespace {

// The Status of the exception being handled (call only inside a catch block).
absl::Status CurrentException(const char* entry) {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of host memory in the CUDA plugin (", entry, ")"));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("the CUDA plugin threw in ", entry, ": ", e.what()));
  } catch (...) {
    return absl::InternalError(absl::StrCat("the CUDA plugin threw in ", entry));
  }
}

}  // namespace

extern "C" {

int dcf_cuda_plugin_abi_version() { return DCF_CUDA_PLUGIN_ABI_VERSION; }

int dcf_cuda_plugin_device_count(absl::Status* error) {
  try {
    return dcf::cuda::gpu::VisibleDeviceCount(error);
  } catch (...) {
    if (error != nullptr) *error = CurrentException("device count");
    return 0;
  }
}

dcf::Backend* dcf_cuda_plugin_create_backend(const dcf::ModelConfig* config,
                                             dcf::ModelWeights* weights,
                                             const dcf::BackendOptions* options,
                                             absl::Status* status) {
  try {
    absl::StatusOr<std::unique_ptr<dcf::Backend>> b =
        dcf::cuda::gpu::CreateBackend(*config, std::move(*weights), *options);
    if (!b.ok()) {
      *status = b.status();
      return nullptr;
    }
    *status = absl::OkStatus();
    return b->release();
  } catch (...) {
    *status = CurrentException("create backend");
    return nullptr;
  }
}

}  // extern "C"
