// Helpers for tests built by dcf_add_cuda_test (both builds): device buffers and a readable
// assertion on cudaError_t.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "engine/simt/cuda_compat.h"
#include "gtest/gtest.h"

#if defined(DCF_CUDA_SIM)
#include "engine/simt/simt_testing.h"
#endif

namespace dcf::cuda_test {

// EXPECT_TRUE(CudaOk(call)): on failure prints the error's name and text (and the
// emulator's detailed message).
inline ::testing::AssertionResult CudaOk(cudaError_t error) {
  if (error == cudaSuccess) return ::testing::AssertionSuccess();
  std::string detail;
#if defined(DCF_CUDA_SIM)
  detail = " [" + dcf::simt::LastErrorMessage() + "]";
#endif
  return ::testing::AssertionFailure()
         << cudaGetErrorName(error) << ": " << cudaGetErrorString(error) << detail;
}

// A device array of `size` elements of T, freed on destruction. Allocation failures are test
// failures.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t size) : size_(size) {
    EXPECT_TRUE(CudaOk(cudaMalloc(&data_, size * sizeof(T))));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) {
    EXPECT_TRUE(CudaOk(cudaMemcpy(data_, host.data(), size_ * sizeof(T), cudaMemcpyHostToDevice)));
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return data_; }
  size_t size() const { return size_; }
  std::vector<T> ToHost() const {
    std::vector<T> host(size_);
    EXPECT_TRUE(CudaOk(cudaMemcpy(host.data(), data_, size_ * sizeof(T), cudaMemcpyDeviceToHost)));
    return host;
  }

 private:
  T* data_ = nullptr;
  size_t size_;
};

}  // namespace dcf::cuda_test
