// The SIMT emulator's test API (emulator builds only; a real CUDA device has no equivalent).
// Tests use it to force device-level conditions that cannot be produced on demand on a GPU.
//
// Thread-safety: every function may be called from any thread, but changing settings while a
// kernel runs on another thread is not supported.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "engine/simt/runtime_types.h"
#include "engine/simt/schedule.h"

namespace dcf::simt {

// Makes `error` sticky, like a device fault: every later runtime call (and cudaGetLastError)
// returns it until ClearErrors(). LastErrorMessage() returns `message`.
void InjectStickyError(cudaError_t error, std::string_view message);

// Clears the sticky error, the calling thread's last error and the last message, as if the
// process restarted its device.
void ClearErrors();

// The message of the most recent error anywhere in the process: a kernel violation (naming
// the kernel, block, thread, call site and offending index), a launch configuration error,
// an injected error or a failed runtime call. Empty when none since ClearErrors().
std::string LastErrorMessage();

// The simulated device memory size, which cudaMemGetInfo reports as total and which
// cudaMalloc allocations may not exceed. Initially DCF_SIMT_DEVICE_MEMORY or 8 GiB. Lowering
// it below what is allocated makes the free size 0; nothing is freed.
void SetDeviceMemoryBytes(size_t bytes);
size_t DeviceMemoryBytes();
// Bytes currently allocated with cudaMalloc (after rounding each allocation to 256 bytes).
size_t DeviceMemoryUsedBytes();

// The compute capability cudaGetDeviceProperties reports (major, minor). Initially 9.0; a
// test lowers it to check what code refuses on older GPUs (the emulator itself still runs
// every kernel). Set it before creating what reads it.
void SetComputeCapability(int major, int minor);

// OS threads that run a grid's blocks (>= 1). Initially DCF_SIMT_THREADS or 1.
void SetWorkerThreads(int threads);
int WorkerThreads();

// The schedule (schedule.h): initially DCF_SIMT_SCHEDULE or linear. Takes effect at the next
// grid, block or wait.
void SetSchedule(const Schedule& schedule);
Schedule GetSchedule();

// Writes the trace (trace.h) to `path` from now on (appending), instead of DCF_SIMT_TRACE;
// "" stops tracing.
void SetTraceFile(const std::string& path);

// Runs every operation queued on every stream now, without a host wait: the device of a
// GPU that ran ahead of the host. Later work (the next step's copies included) has then
// completed before the host waits for earlier work, which the emulator otherwise runs only
// up to the awaited operation (device_queue.h). Errors stay sticky as in any run.
void RunQueuedWork();

// cudaMemcpyAsync calls so far whose host memory was pageable (each also warns once per call
// site).
size_t PageableAsyncCopies();

}  // namespace dcf::simt
