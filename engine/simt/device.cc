// The emulated device: one sm_90-like device (SetComputeCapability may say otherwise), its
// properties, and kernel attributes.
#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>

#include "engine/simt/error_state.h"
#include "engine/simt/kernel_attributes.h"
#include "engine/simt/runtime.h"
#include "engine/simt/simt_testing.h"

namespace dcf::simt {
namespace {

std::atomic<int> compute_capability{90};  // major * 10 + minor

}  // namespace

void SetComputeCapability(int major, int minor) { compute_capability = major * 10 + minor; }

cudaError_t cudaGetDeviceCount(int* count) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (count == nullptr) return detail::Fail(cudaErrorInvalidValue, "cudaGetDeviceCount: null");
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (device != 0) {
    return detail::Fail(cudaErrorInvalidDevice,
                        "cudaSetDevice(" + std::to_string(device) + "): the emulator has device 0");
  }
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (device == nullptr) return detail::Fail(cudaErrorInvalidValue, "cudaGetDevice: null");
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (prop == nullptr) return detail::Fail(cudaErrorInvalidValue, "cudaGetDeviceProperties: null");
  if (device != 0) {
    return detail::Fail(
        cudaErrorInvalidDevice,
        "cudaGetDeviceProperties(" + std::to_string(device) + "): the emulator has device 0");
  }
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "dcformer SIMT emulator");
  prop->totalGlobalMem = DeviceMemoryBytes();
  prop->sharedMemPerBlock = kDefaultSharedPerBlock;
  prop->sharedMemPerBlockOptin = kMaxSharedPerBlockOptin;
  prop->sharedMemPerMultiprocessor = 228 * 1024;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = kMaxThreadsPerBlock;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 0x7fffffff;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->major = compute_capability.load() / 10;
  prop->minor = compute_capability.load() % 10;
  prop->multiProcessorCount = 132;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->l2CacheSize = 50 * 1024 * 1024;
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (func == nullptr) return detail::Fail(cudaErrorInvalidDeviceFunction, "cudaFuncSetAttribute");
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) {
    return detail::Fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: unsupported attribute " +
                                                   std::to_string(static_cast<int>(attr)));
  }
  if (value < 0 || static_cast<size_t>(value) > kMaxSharedPerBlockOptin) {
    return detail::Fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: max dynamic shared memory " +
                                                   std::to_string(value) + " is outside [0, " +
                                                   std::to_string(kMaxSharedPerBlockOptin) + "]");
  }
  detail::SetMaxDynamicSharedBytes(func, static_cast<size_t>(value));
  return cudaSuccess;
}

}  // namespace dcf::simt
