// The CUDA runtime API stand-ins of the SIMT emulator: the same names and signatures as
// CUDA's, in the global namespace (declared in dcf::simt, brought in with using-declarations).
//
// Semantics, where they differ from a GPU:
// - Everything is synchronous: a launch, copy or memset on any stream has finished when the
//   call returns; stream and event synchronisation returns at once.
// - Device memory is host memory with accounting against a simulated device size (8 GiB by
//   default; DCF_SIMT_DEVICE_MEMORY=<bytes, or with a K/M/G suffix>, or
//   dcf::simt::SetDeviceMemoryBytes): cudaMemGetInfo reports it and cudaMalloc fails with
//   cudaErrorMemoryAllocation past it. cudaMalloc memory is 256-byte aligned; its contents
//   are unspecified. Copies and memsets check that their device ranges lie inside one live
//   allocation (cudaErrorInvalidValue otherwise).
// - Errors follow CUDA: a failing call returns its code and sets the calling thread's last
//   error (cudaGetLastError returns and clears it, cudaPeekAtLastError only returns it). A
//   kernel fault (a violation found by the emulator) is sticky: every later call, including
//   cudaGetLastError, returns cudaErrorLaunchFailure until dcf::simt::ClearErrors().
// - One device (ordinal 0), described by cudaGetDeviceProperties as an sm_90 part with 48 KiB
//   default / 227 KiB opt-in shared memory per block and 1024 threads per block.
//
// Thread-safety: every function may be called from any host thread.
#pragma once

#include <cstddef>

#include "engine/simt/runtime_types.h"

namespace dcf::simt {

const char* cudaGetErrorString(cudaError_t error);
const char* cudaGetErrorName(cudaError_t error);
cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();

cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes);
cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value);
template <typename T>
cudaError_t cudaFuncSetAttribute(T* entry, cudaFuncAttribute attr, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(entry), attr, value);
}

cudaError_t cudaMalloc(void** dev_ptr, size_t size);
template <typename T>
cudaError_t cudaMalloc(T** dev_ptr, size_t size) {
  return cudaMalloc(reinterpret_cast<void**>(dev_ptr), size);
}
cudaError_t cudaFree(void* dev_ptr);
cudaError_t cudaMallocHost(void** ptr, size_t size);
template <typename T>
cudaError_t cudaMallocHost(T** ptr, size_t size) {
  return cudaMallocHost(reinterpret_cast<void**>(ptr), size);
}
cudaError_t cudaFreeHost(void* ptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* dev_ptr, int value, size_t count);
cudaError_t cudaMemsetAsync(void* dev_ptr, int value, size_t count, cudaStream_t stream = nullptr);

cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags = 0);

cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

}  // namespace dcf::simt

using dcf::simt::cudaDeviceSynchronize;
using dcf::simt::cudaEventCreate;
using dcf::simt::cudaEventCreateWithFlags;
using dcf::simt::cudaEventDestroy;
using dcf::simt::cudaEventElapsedTime;
using dcf::simt::cudaEventQuery;
using dcf::simt::cudaEventRecord;
using dcf::simt::cudaEventSynchronize;
using dcf::simt::cudaFree;
using dcf::simt::cudaFreeHost;
using dcf::simt::cudaFuncSetAttribute;
using dcf::simt::cudaGetDevice;
using dcf::simt::cudaGetDeviceCount;
using dcf::simt::cudaGetDeviceProperties;
using dcf::simt::cudaGetErrorName;
using dcf::simt::cudaGetErrorString;
using dcf::simt::cudaGetLastError;
using dcf::simt::cudaMalloc;
using dcf::simt::cudaMallocHost;
using dcf::simt::cudaMemcpy;
using dcf::simt::cudaMemcpyAsync;
using dcf::simt::cudaMemGetInfo;
using dcf::simt::cudaMemset;
using dcf::simt::cudaMemsetAsync;
using dcf::simt::cudaPeekAtLastError;
using dcf::simt::cudaSetDevice;
using dcf::simt::cudaStreamCreate;
using dcf::simt::cudaStreamCreateWithFlags;
using dcf::simt::cudaStreamDestroy;
using dcf::simt::cudaStreamQuery;
using dcf::simt::cudaStreamSynchronize;
using dcf::simt::cudaStreamWaitEvent;
