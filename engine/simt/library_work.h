// Work the emulator's stand-ins for GPU libraries (the GEMM of engine/cuda/gemm_sim.cc) put on
// a stream: host code that runs in stream order like the library's kernels would, is recorded
// by a stream capture (a graph node) and appears in the trace (trace.h). Emulator builds only.
#pragma once

#include <functional>

#include "engine/simt/runtime_types.h"

namespace dcf::simt {

// Queues `work` on `stream` as one GEMM of shape m x n x k ("gemm" in the trace). `work` may
// run more than once (graph replays) and must not call the runtime. Returns the sticky error
// when one is pending (then nothing is queued), cudaErrorInvalidResourceHandle for a stream
// that is not live, cudaErrorStreamCaptureImplicit for the legacy stream while a blocking
// stream is being captured.
cudaError_t EnqueueGemm(cudaStream_t stream, int m, int n, int k, std::function<void()> work);

}  // namespace dcf::simt
