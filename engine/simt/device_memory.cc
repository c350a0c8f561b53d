// Device memory of the SIMT emulator: host allocations registered by address, with their
// total held against the simulated device size, poisoned (0xFF) when allocated and freed.
// Copies and memsets check their device ranges against the registry and go through the
// device queues (device_queue.h).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/simt/config.h"
#include "engine/simt/device_queue.h"
#include "engine/simt/error_state.h"
#include "engine/simt/graphs.h"
#include "engine/simt/runtime.h"
#include "engine/simt/simt_testing.h"
#include "engine/simt/stream_registry.h"
#include "engine/simt/trace.h"

namespace dcf::simt {
namespace {

constexpr size_t kAlignment = 256;  // cudaMalloc's guarantee
constexpr unsigned char kPoison = 0xff;  // fresh and freed device memory

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

// True when [p, p + bytes) lies inside one cudaMallocHost block.
bool IsPinned(const void* p, size_t bytes) {
  Memory& m = Get();
  std::lock_guard<std::mutex> lock(m.mu);
  const auto address = reinterpret_cast<uintptr_t>(p);
  auto it = m.host.upper_bound(address);
  if (it == m.host.begin()) return false;
  --it;
  return address - it->first <= it->second && bytes <= it->second - (address - it->first);
}

std::atomic<size_t>& PageableCopies() {
  static std::atomic<size_t> count{0};
  return count;
}

// The capture rules for calls CUDA forbids while a capture is in progress (graphs.h).
cudaError_t UnsafeDuringCapture(const char* call) {
  std::lock_guard<std::mutex> lock(detail::DeviceMutex());
  if (cudaError_t e = detail::CheckUnsafeCallLocked(); e != cudaSuccess) {
    return detail::Fail(e, std::string(call) + ": not permitted while a stream is being captured");
  }
  return cudaSuccess;
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
  if (cudaError_t e = UnsafeDuringCapture("cudaMalloc"); e != cudaSuccess) return e;
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
  // Exactly `size` bytes (256-byte aligned): under AddressSanitizer a kernel's access past
  // the requested end is reported, as compute-sanitizer's memcheck does.
  void* p = nullptr;
  if (posix_memalign(&p, kAlignment, size) != 0) p = nullptr;
  if (p != nullptr) std::memset(p, kPoison, size);
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
  if (cudaError_t e = UnsafeDuringCapture("cudaFree"); e != cudaSuccess && sticky == cudaSuccess) {
    return e;
  }
  // cudaFree synchronises the device: queued work may still use the memory.
  detail::RunAll();
  Memory& m = Get();
  size_t size = 0;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    const auto it = m.device.find(reinterpret_cast<uintptr_t>(dev_ptr));
    if (it == m.device.end()) {
      if (sticky != cudaSuccess) return sticky;
      return detail::Fail(cudaErrorInvalidValue,
                          "cudaFree: pointer is not the start of a live cudaMalloc allocation");
    }
    size = it->second;
    m.used -= Rounded(size);
    m.device.erase(it);
  }
  std::memset(dev_ptr, kPoison, size);
  std::free(dev_ptr);  // freed even under a sticky error, so tests do not leak
  return detail::StickyError();
}

cudaError_t cudaMallocHost(void** ptr, size_t size) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (ptr == nullptr) return detail::Fail(cudaErrorInvalidValue, "cudaMallocHost: null ptr");
  *ptr = nullptr;
  if (cudaError_t e = UnsafeDuringCapture("cudaMallocHost"); e != cudaSuccess) return e;
  *ptr = std::aligned_alloc(kAlignment, Rounded(size == 0 ? 1 : size));
  if (*ptr == nullptr) {
    return detail::Fail(cudaErrorMemoryAllocation, "cudaMallocHost: host allocation failed");
  }
  Memory& m = Get();
  std::lock_guard<std::mutex> lock(m.mu);
  m.host[reinterpret_cast<uintptr_t>(*ptr)] = size == 0 ? 1 : size;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
  const cudaError_t sticky = detail::StickyError();
  if (ptr == nullptr) return sticky;
  if (cudaError_t e = UnsafeDuringCapture("cudaFreeHost");
      e != cudaSuccess && sticky == cudaSuccess) {
    return e;
  }
  detail::RunAll();  // queued copies may still use it
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
  return detail::StickyError();
}

namespace {

// The direction of a copy, with cudaMemcpyDefault resolved; false for an invalid kind.
bool Direction(const void* dst, const void* src, cudaMemcpyKind kind, cudaMemcpyKind* out) {
  if (kind == cudaMemcpyDefault) {
    const bool d = IsDevicePointer(dst), s = IsDevicePointer(src);
    *out = d ? (s ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
             : (s ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
    return true;
  }
  if (kind != cudaMemcpyHostToHost && kind != cudaMemcpyHostToDevice &&
      kind != cudaMemcpyDeviceToHost && kind != cudaMemcpyDeviceToDevice) {
    return false;
  }
  *out = kind;
  return true;
}

// Checks a copy's arguments; fills `work` (without its run function).
cudaError_t PrepareCopy(const char* call, void* dst, const void* src, size_t count,
                        cudaMemcpyKind kind, detail::Work* work) {
  cudaMemcpyKind dir;
  if (!Direction(dst, src, kind, &dir)) {
    return detail::Fail(cudaErrorInvalidMemcpyDirection,
                        std::string(call) + ": invalid cudaMemcpyKind");
  }
  const bool dst_device = dir == cudaMemcpyHostToDevice || dir == cudaMemcpyDeviceToDevice;
  const bool src_device = dir == cudaMemcpyDeviceToHost || dir == cudaMemcpyDeviceToDevice;
  if (dst_device) {
    if (cudaError_t e = CheckDeviceRange(call, "destination", dst, count); e != cudaSuccess) {
      return e;
    }
  }
  if (src_device) {
    if (cudaError_t e = CheckDeviceRange(call, "source", src, count); e != cudaSuccess) return e;
  }
  work->kind = detail::Work::Kind::kMemcpy;
  work->bytes = count;
  work->direction = dir;
  work->host_pinned = (dst_device || IsPinned(dst, count)) && (src_device || IsPinned(src, count));
  work->run = [dst, src, count] { std::memmove(dst, src, count); };
  return cudaSuccess;
}

// The warning for an Async copy with pageable host memory, once per call site.
void WarnPageable(const std::source_location& where, const detail::Work& w) {
  static std::mutex mu;
  static auto* warned = new std::set<std::pair<std::string, unsigned>>();
  PageableCopies().fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mu);
  if (!warned->emplace(where.file_name(), where.line()).second) return;
  std::fprintf(stderr,
               "dcf simt: warning: cudaMemcpyAsync at %s (%s, %zu bytes) uses pageable host "
               "memory: CUDA stages it through a pinned buffer and may block the host; "
               "allocate it with cudaMallocHost (reported once per call site)\n",
               detail::SourceSite(where).c_str(),
               w.direction == cudaMemcpyHostToDevice   ? "host to device"
               : w.direction == cudaMemcpyDeviceToHost ? "device to host"
                                                       : "host to host",
               w.bytes);
}

}  // namespace

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (count == 0) return cudaSuccess;
  detail::Work w;
  if (cudaError_t e = PrepareCopy("cudaMemcpy", dst, src, count, kind, &w); e != cudaSuccess) {
    return e;
  }
  const bool wait = w.direction != cudaMemcpyDeviceToDevice;  // D2D does not block the host
  if (wait) {
    if (cudaError_t e = UnsafeDuringCapture("cudaMemcpy"); e != cudaSuccess) return e;
  }
  detail::TraceWork(w, /*async=*/false);
  uint64_t id = 0;
  if (cudaError_t e = detail::Submit(nullptr, std::move(w), &id); e != cudaSuccess) {
    return detail::Fail(e, "cudaMemcpy: the legacy stream while a blocking stream is captured");
  }
  if (wait) detail::RunUntil(id);
  return detail::StickyError();
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream, std::source_location where) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (!detail::IsLiveStream(stream)) {
    return detail::Fail(cudaErrorInvalidResourceHandle, "cudaMemcpyAsync: stream is not live");
  }
  if (count == 0) return cudaSuccess;
  detail::Work w;
  if (cudaError_t e = PrepareCopy("cudaMemcpyAsync", dst, src, count, kind, &w);
      e != cudaSuccess) {
    return e;
  }
  bool wait = false;
  if (!w.host_pinned) {
    WarnPageable(where, w);
    {
      std::lock_guard<std::mutex> lock(detail::DeviceMutex());
      Stream* s = detail::Resolve(stream);
      if (s->capture != nullptr) {
        detail::InvalidateLocked(*s->capture, cudaErrorStreamCaptureUnsupported);
        return detail::Fail(cudaErrorStreamCaptureUnsupported,
                            "cudaMemcpyAsync: pageable host memory in a capture (a graph "
                            "replays the copy later; use cudaMallocHost memory)");
      }
    }
    if (w.direction == cudaMemcpyDeviceToHost) {
      wait = true;  // CUDA may copy through a staging buffer before returning
    } else {
      // The source is staged at the call, as CUDA does.
      auto staged = std::make_shared<std::vector<unsigned char>>(
          static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + count);
      w.run = [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); };
    }
  }
  detail::TraceWork(w, /*async=*/true);
  uint64_t id = 0;
  if (cudaError_t e = detail::Submit(stream, std::move(w), &id); e != cudaSuccess) {
    return detail::Fail(e, "cudaMemcpyAsync: the legacy stream while a blocking stream is captured");
  }
  if (wait) detail::RunUntil(id);
  return detail::StickyError();
}

namespace {

cudaError_t SubmitMemset(const char* call, void* dev_ptr, int value, size_t count,
                         cudaStream_t stream, bool async) {
  if (cudaError_t e = CheckDeviceRange(call, "device", dev_ptr, count); e != cudaSuccess) {
    return e;
  }
  detail::Work w;
  w.kind = detail::Work::Kind::kMemset;
  w.bytes = count;
  w.run = [dev_ptr, value, count] { std::memset(dev_ptr, value, count); };
  detail::TraceWork(w, async);
  if (cudaError_t e = detail::Submit(stream, std::move(w)); e != cudaSuccess) {
    return detail::Fail(e, std::string(call) +
                               ": the legacy stream while a blocking stream is captured");
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t cudaMemset(void* dev_ptr, int value, size_t count) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (count == 0) return cudaSuccess;
  return SubmitMemset("cudaMemset", dev_ptr, value, count, nullptr, false);
}

cudaError_t cudaMemsetAsync(void* dev_ptr, int value, size_t count, cudaStream_t stream) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (!detail::IsLiveStream(stream)) {
    return detail::Fail(cudaErrorInvalidResourceHandle, "cudaMemsetAsync: stream is not live");
  }
  if (count == 0) return cudaSuccess;
  return SubmitMemset("cudaMemsetAsync", dev_ptr, value, count, stream, true);
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

size_t PageableAsyncCopies() { return PageableCopies().load(); }

size_t DeviceMemoryUsedBytes() {
  Memory& m = Get();
  std::lock_guard<std::mutex> lock(m.mu);
  return m.used;
}

}  // namespace dcf::simt
