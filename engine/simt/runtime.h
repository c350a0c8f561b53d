// The CUDA runtime API stand-ins of the SIMT emulator: the same names and signatures as
// CUDA's, in the global namespace (declared in dcf::simt, brought in with using-declarations).
//
// Semantics, where they differ from a GPU:
// - Work is queued, as on a GPU: a launch, an Async copy or memset, a D2D cudaMemcpy, a
//   cudaMemset and an event record go into their stream's queue and run only when the host
//   waits for them (cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize, a
//   synchronous H2D/D2H/H2H cudaMemcpy, cudaFree/cudaFreeHost, a query). A query of pending
//   work returns cudaErrorNotReady and lets the work finish (the next query succeeds). The
//   legacy default stream (the null handle) synchronises with blocking streams as CUDA's does;
//   cudaStreamNonBlocking streams do not (device_queue.h). A kernel fault found while running
//   queued work is reported by the call that waited (and every later one: it is sticky).
// - cudaMemcpyAsync from or to pageable host memory (not from cudaMallocHost) prints a
//   warning once per call site: H2D copies the source at the call (CUDA stages it), D2H waits
//   for the copy (as CUDA may). During a capture it fails (cudaErrorStreamCaptureUnsupported).
// - Device memory is host memory with accounting against a simulated device size (8 GiB by
//   default; DCF_SIMT_DEVICE_MEMORY=<bytes, or with a K/M/G suffix>, or
//   dcf::simt::SetDeviceMemoryBytes): cudaMemGetInfo reports it and cudaMalloc fails with
//   cudaErrorMemoryAllocation past it. cudaMalloc memory is 256-byte aligned and filled with
//   0xFF bytes (NaN floats, -1 integers), and so is memory given back to cudaFree, so that a
//   read of memory never written is not a forgiving zero. Copies and memsets check that their
//   device ranges lie inside one live allocation (cudaErrorInvalidValue otherwise).
// - Errors follow CUDA: a failing call returns its code and sets the calling thread's last
//   error (cudaGetLastError returns and clears it, cudaPeekAtLastError only returns it). A
//   kernel fault (a violation found by the emulator) is sticky: every later call, including
//   cudaGetLastError, returns cudaErrorLaunchFailure until dcf::simt::ClearErrors().
// - Graphs: stream capture (cudaStreamBeginCapture ... cudaStreamEndCapture, forks and joins
//   through events), cudaGraphInstantiate, cudaGraphLaunch, cudaGraphExecUpdate,
//   cudaGraphGetNodes and the destroy calls. Captured work is recorded, not run; a launch
//   runs the nodes in a topological order (the schedule's). During a global capture (or a
//   thread-local one, on its thread) cudaMalloc, cudaFree, synchronous copies and memsets and
//   cudaDeviceSynchronize fail with cudaErrorStreamCaptureUnsupported and invalidate it;
//   synchronising or querying a capturing stream, or the legacy stream while a blocking
//   stream captures, likewise (CUDA's rules). Child graphs are not supported.
// - One device (ordinal 0), described by cudaGetDeviceProperties as an sm_90 part with 48 KiB
//   default / 227 KiB opt-in shared memory per block and 1024 threads per block.
//
// Thread-safety: every function may be called from any host thread.
#pragma once

#include <cstddef>
#include <source_location>

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
                            cudaStream_t stream = nullptr,
                            std::source_location where = std::source_location::current());
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

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status);
cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* num_nodes);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags = 0);
cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph,
                                cudaGraphExecUpdateResultInfo* info);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream);

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
using dcf::simt::cudaGraphDestroy;
using dcf::simt::cudaGraphExecDestroy;
using dcf::simt::cudaGraphExecUpdate;
using dcf::simt::cudaGraphGetNodes;
using dcf::simt::cudaGraphInstantiate;
using dcf::simt::cudaGraphLaunch;
using dcf::simt::cudaMalloc;
using dcf::simt::cudaMallocHost;
using dcf::simt::cudaMemcpy;
using dcf::simt::cudaMemcpyAsync;
using dcf::simt::cudaMemGetInfo;
using dcf::simt::cudaMemset;
using dcf::simt::cudaMemsetAsync;
using dcf::simt::cudaPeekAtLastError;
using dcf::simt::cudaSetDevice;
using dcf::simt::cudaStreamBeginCapture;
using dcf::simt::cudaStreamCreate;
using dcf::simt::cudaStreamCreateWithFlags;
using dcf::simt::cudaStreamDestroy;
using dcf::simt::cudaStreamEndCapture;
using dcf::simt::cudaStreamIsCapturing;
using dcf::simt::cudaStreamQuery;
using dcf::simt::cudaStreamSynchronize;
using dcf::simt::cudaStreamWaitEvent;
