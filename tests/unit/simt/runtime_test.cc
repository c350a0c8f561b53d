// The emulator's runtime stand-ins: launch configuration errors, memory accounting, range
// checks, sticky errors, streams, events and device properties.
#include <cstring>
#include <string>
#include <vector>

#include "engine/simt/simt_testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/simt/cuda_test_util.h"
#include "tests/unit/simt/violation_kernels.h"

namespace dcf::cuda_test {
namespace {

using ::testing::HasSubstr;

class RuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override { simt::ClearErrors(); }
  void TearDown() override { simt::ClearErrors(); }
};

TEST_F(RuntimeTest, BlockOver1024ThreadsIsAConfigurationError) {
  std::vector<int> out(1025, -1);
  EXPECT_EQ(LaunchIota(out.data(), 1025, 0), cudaErrorInvalidConfiguration);
  EXPECT_THAT(simt::LastErrorMessage(),
              HasSubstr("launch of kernel 'IotaKernel': block (1025,1,1) has 1025 threads"));
  EXPECT_EQ(out[0], -1) << "the kernel must not run";
  // Not sticky: cudaGetLastError cleared it, the next launch works.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_TRUE(CudaOk(LaunchIota(out.data(), 1024, 0)));
  EXPECT_TRUE(CudaOk(cudaDeviceSynchronize()));  // the launch was queued
  EXPECT_EQ(out[1023], 1023);
}

TEST_F(RuntimeTest, ZeroSizedLaunchIsAConfigurationError) {
  std::vector<int> out(1, -1);
  EXPECT_EQ(LaunchIota(out.data(), 0, 0), cudaErrorInvalidConfiguration);
  EXPECT_THAT(simt::LastErrorMessage(), HasSubstr("is empty"));
}

TEST_F(RuntimeTest, DynamicSharedMemoryOverTheDefaultLimit) {
  std::vector<int> out(32, -1);
  EXPECT_EQ(LaunchIota(out.data(), 32, 48 * 1024 + 4), cudaErrorInvalidValue);
  EXPECT_THAT(simt::LastErrorMessage(),
              HasSubstr("49156 bytes of dynamic shared memory exceed the kernel's limit of "
                        "49152 bytes"));
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the launcher's cudaGetLastError cleared it";
  EXPECT_EQ(out[0], -1) << "the kernel must not run";
  EXPECT_TRUE(CudaOk(LaunchIota(out.data(), 32, 48 * 1024)));
  EXPECT_TRUE(CudaOk(cudaDeviceSynchronize()));
  EXPECT_EQ(out[31], 31);
}

TEST_F(RuntimeTest, FuncSetAttributeRejectsMoreThanTheOptInMaximum) {
  cudaDeviceProp prop;
  ASSERT_TRUE(CudaOk(cudaGetDeviceProperties(&prop, 0)));
  const void* some_function = reinterpret_cast<const void*>(&RuntimeTest::SetUpTestSuite);
  EXPECT_EQ(cudaFuncSetAttribute(some_function, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(prop.sharedMemPerBlockOptin) + 1),
            cudaErrorInvalidValue);
  EXPECT_TRUE(
      CudaOk(cudaFuncSetAttribute(some_function, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(prop.sharedMemPerBlockOptin))));
}

TEST_F(RuntimeTest, InjectedStickyErrorIsReportedUntilCleared) {
  simt::InjectStickyError(cudaErrorIllegalAddress, "injected by the test");
  EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress);
  EXPECT_EQ(cudaGetLastError(), cudaErrorIllegalAddress) << "sticky: not cleared by reading";
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorIllegalAddress);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 64), cudaErrorIllegalAddress);
  size_t free_bytes = 0, total_bytes = 0;
  EXPECT_EQ(cudaMemGetInfo(&free_bytes, &total_bytes), cudaErrorIllegalAddress);
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreate(&stream), cudaErrorIllegalAddress);
  std::vector<int> out(32, -1);
  EXPECT_EQ(LaunchIota(out.data(), 32, 0), cudaErrorIllegalAddress);
  EXPECT_EQ(out[5], -1) << "no kernel runs while a sticky error is pending";
  EXPECT_EQ(simt::LastErrorMessage(), "injected by the test");
  EXPECT_STREQ(cudaGetErrorName(cudaErrorIllegalAddress), "cudaErrorIllegalAddress");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorIllegalAddress),
               "an illegal memory access was encountered");

  simt::ClearErrors();
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_TRUE(CudaOk(cudaMalloc(&p, 64)));
  EXPECT_TRUE(CudaOk(cudaFree(p)));
  EXPECT_TRUE(CudaOk(LaunchIota(out.data(), 32, 0)));
  EXPECT_TRUE(CudaOk(cudaDeviceSynchronize()));
  EXPECT_EQ(out[5], 5);
}

TEST_F(RuntimeTest, DeviceMemoryIsAccountedAgainstTheSimulatedSize) {
  const size_t saved = simt::DeviceMemoryBytes();
  const size_t used_before = simt::DeviceMemoryUsedBytes();
  simt::SetDeviceMemoryBytes(used_before + (1 << 20));
  size_t free_bytes = 0, total_bytes = 0;
  ASSERT_TRUE(CudaOk(cudaMemGetInfo(&free_bytes, &total_bytes)));
  EXPECT_EQ(total_bytes, used_before + (1 << 20));
  EXPECT_EQ(free_bytes, size_t{1} << 20);

  void* a = nullptr;
  ASSERT_TRUE(CudaOk(cudaMalloc(&a, 600 * 1024 + 1)));  // rounded up to 256 bytes
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 256, 0u);
  ASSERT_TRUE(CudaOk(cudaMemGetInfo(&free_bytes, &total_bytes)));
  EXPECT_EQ(free_bytes, (size_t{1} << 20) - (600 * 1024 + 256));
  void* b = nullptr;
  EXPECT_EQ(cudaMalloc(&b, 600 * 1024), cudaErrorMemoryAllocation);
  EXPECT_EQ(b, nullptr);
  EXPECT_THAT(simt::LastErrorMessage(), HasSubstr("cudaMalloc of 614400 bytes"));
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorMemoryAllocation) << "peeking does not clear";
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "out of memory is not sticky";
  ASSERT_TRUE(CudaOk(cudaFree(a)));
  ASSERT_TRUE(CudaOk(cudaMemGetInfo(&free_bytes, &total_bytes)));
  EXPECT_EQ(free_bytes, size_t{1} << 20);
  ASSERT_TRUE(CudaOk(cudaMalloc(&b, 600 * 1024)));
  EXPECT_TRUE(CudaOk(cudaFree(b)));

  cudaDeviceProp prop;
  ASSERT_TRUE(CudaOk(cudaGetDeviceProperties(&prop, 0)));
  EXPECT_EQ(prop.totalGlobalMem, used_before + (1 << 20));
  simt::SetDeviceMemoryBytes(saved);
}

TEST_F(RuntimeTest, CopiesAndMemsetsStayInsideAllocations) {
  std::vector<char> host(256, 1);
  char* dev = nullptr;
  ASSERT_TRUE(CudaOk(cudaMalloc(&dev, 100)));
  EXPECT_TRUE(CudaOk(cudaMemcpy(dev, host.data(), 100, cudaMemcpyHostToDevice)));
  EXPECT_TRUE(CudaOk(cudaMemcpy(dev + 40, host.data(), 60, cudaMemcpyHostToDevice)));
  EXPECT_EQ(cudaMemcpy(dev + 40, host.data(), 61, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_THAT(simt::LastErrorMessage(), HasSubstr("cudaMemcpy: destination range"));
  EXPECT_EQ(cudaMemcpy(host.data(), dev, 101, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(host.data(), host.data() + 128, 8, cudaMemcpyHostToDevice),
            cudaErrorInvalidValue)
      << "a host pointer as the device side";
  EXPECT_EQ(cudaMemset(dev + 1, 0, 100), cudaErrorInvalidValue);
  EXPECT_TRUE(CudaOk(cudaMemset(dev + 1, 7, 99)));
  // cudaMemcpyDefault infers the direction from the pointers.
  std::vector<char> back(100, 0);
  EXPECT_TRUE(CudaOk(cudaMemcpy(back.data(), dev, 100, cudaMemcpyDefault)));
  EXPECT_EQ(back[0], 1);
  EXPECT_EQ(back[99], 7);
  EXPECT_EQ(cudaFree(host.data()), cudaErrorInvalidValue);
  EXPECT_TRUE(CudaOk(cudaFree(dev)));
  EXPECT_EQ(cudaFree(dev), cudaErrorInvalidValue) << "double free";
  EXPECT_TRUE(CudaOk(cudaFree(nullptr)));
  cudaGetLastError();

  void* pinned = nullptr;
  ASSERT_TRUE(CudaOk(cudaMallocHost(&pinned, 1000)));
  EXPECT_TRUE(CudaOk(cudaFreeHost(pinned)));
  EXPECT_EQ(cudaFreeHost(pinned), cudaErrorInvalidValue);
}

TEST_F(RuntimeTest, StreamsAndEvents) {
  cudaStream_t stream = nullptr;
  ASSERT_TRUE(CudaOk(cudaStreamCreate(&stream)));
  cudaEvent_t start = nullptr, stop = nullptr, untimed = nullptr;
  ASSERT_TRUE(CudaOk(cudaEventCreate(&start)));
  ASSERT_TRUE(CudaOk(cudaEventCreate(&stop)));
  ASSERT_TRUE(CudaOk(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming)));
  float ms = -1;
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, stop), cudaErrorInvalidResourceHandle)
      << "not recorded yet";
  ASSERT_TRUE(CudaOk(cudaEventRecord(start, stream)));
  ASSERT_TRUE(CudaOk(cudaEventRecord(stop, stream)));
  ASSERT_TRUE(CudaOk(cudaStreamWaitEvent(nullptr, stop, 0)));
  ASSERT_TRUE(CudaOk(cudaEventSynchronize(stop)));
  EXPECT_TRUE(CudaOk(cudaEventQuery(stop)));
  EXPECT_TRUE(CudaOk(cudaStreamQuery(stream)));
  ASSERT_TRUE(CudaOk(cudaEventElapsedTime(&ms, start, stop)));
  EXPECT_GE(ms, 0.0f);
  ASSERT_TRUE(CudaOk(cudaEventRecord(untimed, stream)));
  EXPECT_EQ(cudaEventElapsedTime(&ms, start, untimed), cudaErrorInvalidResourceHandle);
  EXPECT_TRUE(CudaOk(cudaEventDestroy(start)));
  EXPECT_TRUE(CudaOk(cudaEventDestroy(stop)));
  EXPECT_TRUE(CudaOk(cudaEventDestroy(untimed)));
  EXPECT_TRUE(CudaOk(cudaStreamDestroy(stream)));
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaErrorInvalidResourceHandle) << "destroyed";
  std::vector<char> host(8);
  EXPECT_EQ(cudaMemcpyAsync(host.data(), host.data(), 8, cudaMemcpyHostToHost, stream),
            cudaErrorInvalidResourceHandle);
}

TEST_F(RuntimeTest, OneSm90LikeDevice) {
  int count = 0;
  ASSERT_TRUE(CudaOk(cudaGetDeviceCount(&count)));
  EXPECT_EQ(count, 1);
  EXPECT_TRUE(CudaOk(cudaSetDevice(0)));
  EXPECT_EQ(cudaSetDevice(1), cudaErrorInvalidDevice);
  int device = -1;
  EXPECT_TRUE(CudaOk(cudaGetDevice(&device)));
  EXPECT_EQ(device, 0);
  cudaDeviceProp prop;
  ASSERT_TRUE(CudaOk(cudaGetDeviceProperties(&prop, 0)));
  EXPECT_STREQ(prop.name, "dcformer SIMT emulator");
  EXPECT_EQ(prop.warpSize, 32);
  EXPECT_EQ(prop.maxThreadsPerBlock, 1024);
  EXPECT_EQ(prop.sharedMemPerBlock, 48u * 1024);
  EXPECT_EQ(prop.sharedMemPerBlockOptin, 227u * 1024);
  EXPECT_EQ(prop.major, 9);
  EXPECT_EQ(prop.minor, 0);
  EXPECT_GT(prop.multiProcessorCount, 0);
}

}  // namespace
}  // namespace dcf::cuda_test
