// Device memory of the SIMT emulator: host allocations registered by address, with their
// total held against the simulated device size. Copies and memsets check their device
// ranges against the registry.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "engine/simt/config.h"
#include "engine/simt/error_state.h"
#include "engine/simt/runtime.h"
#include "engine/simt/simt_testing.h"
#include "engine/simt/stream_registry.h"

namespace dcf::simt {
namespace {

constexpr size_t kAlignment = 256;  // cudaMalloc's guarantee

struct Memory {
  std::mutex mu;
  std::map<uintptr_t, size_t> device;  // start -> requested bytes; guarded by mu
  std::map<uintptr_t, size_t> host;    // cudaMallocHost blocks; guarded by mu
  size_t used = 0;                     // rounded bytes of `device`; guarded by mu
  size_t total = detail::GetConfig().device_memory_bytes;  // guarded by mu
};

Memory& Get() {
  static auto* memory = new Memory();
  return *memory;
}

size_t Rounded(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

// True when [p, p + bytes) lies inside one live device allocation. Requires mu.
bool InDeviceAllocation(const Memory& m, const void* p, size_t bytes) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  auto it = m.device.upper_bound(address);
  if (it == m.device.begin()) return false;
  --it;
  return address - it->first <= it->second && bytes <= it->second - (address - it->first);
}

bool IsDevicePointer(const void* p) {
  Memory& m = Get();
  std::lock_guard<std::mutex> lock(m.mu);
  return InDeviceAllocation(m, p, 1);
}

cudaError_t CheckDeviceRange(const char* call, const char* which, const void* p, size_t bytes) {
  Memory& m = Get();
  std::lock_guard<std::mutex> lock(m.mu);
  if (InDeviceAllocation(m, p, bytes)) return cudaSuccess;
  char text[200];
  std::snprintf(text, sizeof(text),
                "%s: %s range [%p, +%zu bytes) is not inside one live cudaMalloc allocation", call,
                which, p, bytes);
  return detail::Fail(cudaErrorInvalidValue, text);
}

}  // namespace

cudaError_t cudaMalloc(void** dev_ptr, size_t size) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (dev_ptr == nullptr) return detail::Fail(cudaErrorInvalidValue, "cudaMalloc: null dev_ptr");
  *dev_ptr = nullptr;
  if (size == 0) return cudaSuccess;
  Memory& m = Get();
  const size_t rounded = Rounded(size);
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (rounded > m.total || m.used > m.total - rounded) {
      return detail::Fail(cudaErrorMemoryAllocation,
                          "cudaMalloc of " + std::to_string(size) + " bytes: " +
                              std::to_string(m.total - std::min(m.used, m.total)) + " of " +
                              std::to_string(m.total) + " bytes of device memory are free");
    }
    m.used += rounded;
  }
  void* p = std::aligned_alloc(kAlignment, rounded);
  std::lock_guard<std::mutex> lock(m.mu);
  if (p == nullptr) {
    m.used -= rounded;
    return detail::Fail(cudaErrorMemoryAllocation,
                        "cudaMalloc of " + std::to_string(size) + " bytes: host allocation failed");
  }
  m.device[reinterpret_cast<uintptr_t>(p)] = size;
  *dev_ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* dev_ptr) {
  const cudaError_t sticky = detail::StickyError();
  if (dev_ptr == nullptr) return sticky;
  Memory& m = Get();
  {
    std::lock_guard<std::mutex> lock(m.mu);
    const auto it = m.device.find(reinterpret_cast<uintptr_t>(dev_ptr));
    if (it == m.device.end()) {
      if (sticky != cudaSuccess) return sticky;
      return detail::Fail(cudaErrorInvalidValue,
                          "cudaFree: pointer is not the start of a live cudaMalloc allocation");
    }
    m.used -= Rounded(it->second);
    m.device.erase(it);
  }
  std::free(dev_ptr);  // freed even under a sticky error, so tests do not leak
  return sticky;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (ptr == nullptr) return detail::Fail(cudaErrorInvalidValue, "cudaMallocHost: null ptr");
  *ptr = std::aligned_alloc(kAlignment, Rounded(size == 0 ? 1 : size));
  if (*ptr == nullptr) {
    return detail::Fail(cudaErrorMemoryAllocation, "cudaMallocHost: host allocation failed");
  }
  Memory& m = Get();
  std::lock_guard<std::mutex> lock(m.mu);
  m.host[reinterpret_cast<uintptr_t>(*ptr)] = size;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
  const cudaError_t sticky = detail::StickyError();
  if (ptr == nullptr) return sticky;
  Memory& m = Get();
  {
    std::lock_guard<std::mutex> lock(m.mu);
    if (m.host.erase(reinterpret_cast<uintptr_t>(ptr)) == 0) {
      if (sticky != cudaSuccess) return sticky;
      return detail::Fail(cudaErrorInvalidValue,
                          "cudaFreeHost: pointer was not returned by cudaMallocHost");
    }
  }
  std::free(ptr);
  return sticky;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (count == 0) return cudaSuccess;
  bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind == cudaMemcpyDefault) {
    dst_device = IsDevicePointer(dst);
    src_device = IsDevicePointer(src);
  } else if (kind != cudaMemcpyHostToHost && !dst_device && !src_device) {
    return detail::Fail(cudaErrorInvalidMemcpyDirection, "cudaMemcpy: invalid cudaMemcpyKind");
  }
  if (dst_device) {
    if (cudaError_t e = CheckDeviceRange("cudaMemcpy", "destination", dst, count);
        e != cudaSuccess) {
      return e;
    }
  }
  if (src_device) {
    if (cudaError_t e = CheckDeviceRange("cudaMemcpy", "source", src, count); e != cudaSuccess) {
      return e;
    }
  }
  std::memmove(dst, src, count);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (!detail::IsLiveStream(stream)) {
    return detail::Fail(cudaErrorInvalidResourceHandle, "cudaMemcpyAsync: stream is not live");
  }
  return cudaMemcpy(dst, src, count, kind);
}

cudaError_t cudaMemset(void* dev_ptr, int value, size_t count) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (count == 0) return cudaSuccess;
  if (cudaError_t e = CheckDeviceRange("cudaMemset", "device", dev_ptr, count); e != cudaSuccess) {
    return e;
  }
  std::memset(dev_ptr, value, count);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* dev_ptr, int value, size_t count, cudaStream_t stream) {
  if (!detail::IsLiveStream(stream)) {
    return detail::Fail(cudaErrorInvalidResourceHandle, "cudaMemsetAsync: stream is not live");
  }
  return cudaMemset(dev_ptr, value, count);
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (free_bytes == nullptr || total_bytes == nullptr) {
    return detail::Fail(cudaErrorInvalidValue, "cudaMemGetInfo: null argument");
  }
  Memory& m = Get();
  std::lock_guard<std::mutex> lock(m.mu);
  *total_bytes = m.total;
  *free_bytes = m.used >= m.total ? 0 : m.total - m.used;
  return cudaSuccess;
}

void SetDeviceMemoryBytes(size_t bytes) {
  Memory& m = Get();
  std::lock_guard<std::mutex> lock(m.mu);
  m.total = bytes;
}

size_t DeviceMemoryBytes() {
  Memory& m = Get();
  std::lock_guard<std::mutex> lock(m.mu);
  return m.total;
}

size_t DeviceMemoryUsedBytes() {
  Memory& m = Get();
  std::lock_guard<std::mutex> lock(m.mu);
  return m.used;
}

}  // namespace dcf::simt
