// Graphs of the SIMT emulator (internal): what stream capture records, what
// cudaGraphInstantiate copies, and the capture rules the queues (device_queue.cc) and the
// runtime calls consult. The API is in runtime.h; docs/CUDA_SIM.md describes it.
//
// All state here is guarded by DeviceMutex() (device_queue.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "engine/simt/device_queue.h"

namespace dcf::simt {

struct GraphNode {
  detail::Work work;
  std::vector<size_t> deps;  // indices of earlier nodes of the same graph
  size_t index = 0;
};

struct Graph {
  std::vector<std::unique_ptr<GraphNode>> nodes;  // in capture order (a topological order)
};

struct GraphExec {
  std::shared_ptr<const std::vector<GraphNode>> nodes;  // the instantiated copy
  uint64_t last_launch = 0;  // launches of one executable graph run one after the other
};

namespace detail {

struct CaptureState {
  Stream* origin = nullptr;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;
  std::unique_ptr<Graph> graph;
  cudaError_t invalidated = cudaSuccess;  // the first error that invalidated the capture
  std::vector<Stream*> streams;           // every stream in the capture, origin first
};

// Appends `work` as a node of `s`'s capture, after s's tail; s becomes the node.
void CaptureAppendLocked(Stream* s, Work work);

// Marks the capture invalid (cudaStreamEndCapture then fails with
// cudaErrorStreamCaptureInvalidated), the first reason kept.
void InvalidateLocked(CaptureState& capture, cudaError_t why);

// For calls CUDA forbids while a capture is in progress (cudaMalloc, cudaFree, synchronous
// copies and memsets, cudaDeviceSynchronize): every global-mode capture, and every
// thread-local capture begun by the calling thread, is invalidated and the call fails with
// cudaErrorStreamCaptureUnsupported. cudaSuccess when no such capture is active.
cudaError_t CheckUnsafeCallLocked();

// True while some blocking stream (not cudaStreamNonBlocking) is being captured: the legacy
// stream may not be used then (cudaErrorStreamCaptureImplicit).
bool BlockingStreamCapturingLocked();

// Ends the capture of every stream in `capture` (on a stream's destruction or EndCapture).
void EndCaptureLocked(CaptureState& capture);

// Forgets `s` in the capture registry (before the stream is destroyed).
void ForgetStreamLocked(Stream* s);

}  // namespace detail
}  // namespace dcf::simt
