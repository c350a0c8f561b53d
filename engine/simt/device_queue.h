// The emulated device's work queues. Every stream, and the legacy default stream (the null
// handle), is a FIFO of operations (kernels, copies, memsets, GEMMs of the library stand-in,
// event records and waits, graph launches) that run only when the host waits for them:
// cudaStreamSynchronize, cudaEventSynchronize, cudaDeviceSynchronize, a synchronous copy, a
// query (which reports cudaErrorNotReady when work was pending, and lets it finish), cudaFree.
// A wait runs exactly the work it needs: the awaited operation, what precedes it in its stream
// and, transitively, what those depend on. Ordering between streams follows CUDA:
//   - an operation on the legacy stream waits for all earlier work of every blocking stream
//     (created without cudaStreamNonBlocking), and blocking-stream work waits for earlier
//     legacy-stream work; non-blocking streams are independent of the legacy stream;
//   - cudaStreamWaitEvent orders a stream after the event's record.
// Where a wait leaves a choice (several independent operations are needed), the schedule
// (schedule.h) picks: linear takes them in issue order, reverse latest first, random by seed.
//
// A stream being captured (graphs.cc) appends its work to the capture's graph instead.
//
// Thread-safe: any host thread may submit and wait; one thread at a time runs work.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/simt/runtime_types.h"
#include "engine/simt/vector_types.h"

namespace dcf::simt {
namespace detail {

// One operation of device work: what runs, and what the trace (trace.h) says about it.
struct Work {
  enum class Kind : uint8_t { kKernel, kGemm, kMemcpy, kMemset, kEventRecord, kEventWait, kGraph };
  Kind kind = Kind::kKernel;
  std::function<void()> run;  // the work; empty for markers. Re-runnable (graph replays).
  // kKernel:
  std::string name;
  const void* function = nullptr;
  dim3 grid{1, 1, 1};
  dim3 block{1, 1, 1};
  size_t smem = 0;  // dynamic shared memory bytes
  // kGemm:
  int m = 0, n = 0, k = 0;
  // kMemcpy, kMemset:
  size_t bytes = 0;
  cudaMemcpyKind direction = cudaMemcpyDeviceToDevice;  // resolved (never Default)
  bool host_pinned = true;                              // the host side of a copy
  // kGraph: the executable graph's node count
  size_t nodes = 0;
};

struct Op {
  uint64_t id = 0;
  std::vector<uint64_t> deps;  // operations of other streams that must complete first
  Work work;
};

struct CaptureState;  // graphs.cc

}  // namespace detail

struct Stream {
  unsigned int flags = 0;
  bool legacy = false;
  std::deque<detail::Op> queue;  // pending, in issue order; guarded by the device mutex
  uint64_t last_op = 0;          // the last operation submitted (0: none); guarded
  // While capturing (guarded): the capture, and the graph nodes the next node depends on.
  std::shared_ptr<detail::CaptureState> capture;
  std::vector<size_t> capture_tail;
};

// What an event's record sets when it runs (shared with the queued record, which may run
// after the event handle is destroyed).
struct EventTime {
  bool done = false;
  std::chrono::steady_clock::time_point time;
};

struct Event {
  unsigned int flags = 0;
  bool recorded = false;  // a record was issued
  uint64_t op = 0;        // the queued record operation
  std::shared_ptr<EventTime> time;
  // Recorded in a capture: that capture and the nodes the record followed.
  std::shared_ptr<detail::CaptureState> capture;
  std::vector<size_t> capture_tail;
};

namespace detail {

// The mutex guarding queues, handles and capture state (reentrant use is a bug).
std::mutex& DeviceMutex();
// The legacy default stream's state (the null handle).
Stream& LegacyStream();
// nullptr -> the legacy stream. Requires nothing; never fails.
inline Stream* Resolve(cudaStream_t s) { return s != nullptr ? s : &LegacyStream(); }

// Live-handle registry. Require DeviceMutex.
bool IsLiveStreamLocked(cudaStream_t stream);
bool IsLiveEventLocked(cudaEvent_t event);
void RegisterStream(Stream* stream);
bool UnregisterStream(Stream* stream);
void RegisterEvent(Event* event);
bool UnregisterEvent(Event* event);
// Every live stream (legacy first). Requires DeviceMutex.
std::vector<Stream*> AllStreamsLocked();

// Appends `work` to `stream` (or to its capture's graph when it is capturing). `op_id`
// receives the operation's id (0 when captured). Errors: cudaErrorStreamCaptureImplicit
// when legacy-stream work would depend on a capturing blocking stream (the capture is then
// invalidated). Does not check the handle (callers did) or the sticky error.
cudaError_t Submit(cudaStream_t stream, Work work, uint64_t* op_id = nullptr);
// The same with extra dependencies (cudaStreamWaitEvent). Requires DeviceMutex.
cudaError_t SubmitLocked(Stream* stream, Work work, std::vector<uint64_t> deps,
                         uint64_t* op_id);

// Runs work until operation `id` has completed (nothing when it already has).
void RunUntil(uint64_t id);
// Runs every operation submitted to `stream` so far (and what it depends on).
void RunStream(cudaStream_t stream);
// Runs everything submitted so far.
void RunAll();
// True while operation `id` has not completed. Takes DeviceMutex.
bool Pending(uint64_t id);
bool PendingLocked(uint64_t id);
// True while `stream` holds unfinished work. Takes DeviceMutex.
bool StreamPending(cudaStream_t stream);

}  // namespace detail
}  // namespace dcf::simt
