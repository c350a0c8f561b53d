// RAII owners of device memory and page-locked host memory (both builds: on the SIMT
// emulator they are host memory accounted against the simulated device).
//
// Move-only. Not thread-safe. Freeing ignores errors: after a sticky device fault the
// process can only report the fault, not reclaim memory.
#pragma once

#include <cstddef>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/simt/cuda_compat.h"
#include "engine/cuda/cuda_status.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {

// `bytes` of device memory (cudaMalloc: 256-byte aligned). Empty when bytes == 0.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // ResourceExhausted naming `what` when the device has no room, Internal on other errors.
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes, absl::string_view what) {
    DeviceBuffer b;
    if (bytes == 0) return b;
    const cudaError_t e = cudaMalloc(&b.data_, bytes);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // not sticky: clear it
      return absl::ResourceExhaustedError(
          absl::StrCat("out of device memory allocating ", bytes, " bytes for ", what));
    }
    if (e != cudaSuccess) {
      b.data_ = nullptr;
      return CudaStatus(e, absl::StrCat("cudaMalloc of ", what));
    }
    b.bytes_ = bytes;
    return b;
  }

  void Reset() {
    if (data_ != nullptr) cudaFree(data_);
    data_ = nullptr;
    bytes_ = 0;
  }

  void* get() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }
  bool empty() const { return bytes_ == 0; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// `bytes` of page-locked host memory (cudaMallocHost), so async copies really are async.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { Reset(); }
  PinnedBuffer(PinnedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  static absl::StatusOr<PinnedBuffer> Allocate(size_t bytes, absl::string_view what) {
    PinnedBuffer b;
    if (bytes == 0) return b;
    const cudaError_t e = cudaMallocHost(&b.data_, bytes);
    if (e != cudaSuccess) {
      b.data_ = nullptr;
      if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        return absl::ResourceExhaustedError(
            absl::StrCat("out of page-locked host memory allocating ", bytes, " bytes for ", what));
      }
      return CudaStatus(e, absl::StrCat("cudaMallocHost of ", what));
    }
    b.bytes_ = bytes;
    return b;
  }

  void Reset() {
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = nullptr;
    bytes_ = 0;
  }

  void* get() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
