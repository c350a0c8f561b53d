// Streams and events of the SIMT emulator. All work is done synchronously at the call, so a
// stream is only a handle to validate and synchronisation returns at once; an event records
// the host time when it is recorded.
#include <chrono>
#include <mutex>
#include <set>

#include "engine/simt/error_state.h"
#include "engine/simt/runtime.h"
#include "engine/simt/stream_registry.h"

namespace dcf::simt {

struct Stream {
  unsigned int flags;
};

struct Event {
  unsigned int flags;
  bool recorded = false;
  std::chrono::steady_clock::time_point time;
};

namespace {

struct Handles {
  std::mutex mu;
  std::set<Stream*> streams;  // guarded by mu
  std::set<Event*> events;    // guarded by mu
};

Handles& Get() {
  static auto* handles = new Handles();
  return *handles;
}

bool IsLiveEvent(Event* event) {
  std::lock_guard<std::mutex> lock(Get().mu);
  return Get().events.count(event) != 0;
}

cudaError_t BadHandle(const char* call, const char* what) {
  return detail::Fail(cudaErrorInvalidResourceHandle,
                      std::string(call) + ": " + what + " is not a live handle");
}

}  // namespace

namespace detail {
bool IsLiveStream(cudaStream_t stream) {
  if (stream == nullptr) return true;
  std::lock_guard<std::mutex> lock(Get().mu);
  return Get().streams.count(stream) != 0;
}
}  // namespace detail

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (stream == nullptr || (flags & ~cudaStreamNonBlocking) != 0) {
    return detail::Fail(cudaErrorInvalidValue, "cudaStreamCreateWithFlags: bad argument");
  }
  *stream = new Stream{flags};
  std::lock_guard<std::mutex> lock(Get().mu);
  Get().streams.insert(*stream);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  const cudaError_t sticky = detail::StickyError();
  {
    std::lock_guard<std::mutex> lock(Get().mu);
    if (stream == nullptr || Get().streams.erase(stream) == 0) {
      if (sticky != cudaSuccess) return sticky;
      return BadHandle("cudaStreamDestroy", "the stream");
    }
  }
  delete stream;
  return sticky;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (!detail::IsLiveStream(stream)) return BadHandle("cudaStreamSynchronize", "the stream");
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (!detail::IsLiveStream(stream)) return BadHandle("cudaStreamQuery", "the stream");
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (!detail::IsLiveStream(stream)) return BadHandle("cudaStreamWaitEvent", "the stream");
  if (!IsLiveEvent(event)) return BadHandle("cudaStreamWaitEvent", "the event");
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (event == nullptr || (flags & ~(cudaEventBlockingSync | cudaEventDisableTiming)) != 0) {
    return detail::Fail(cudaErrorInvalidValue, "cudaEventCreateWithFlags: bad argument");
  }
  *event = new Event{flags, false, {}};
  std::lock_guard<std::mutex> lock(Get().mu);
  Get().events.insert(*event);
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  const cudaError_t sticky = detail::StickyError();
  {
    std::lock_guard<std::mutex> lock(Get().mu);
    if (event == nullptr || Get().events.erase(event) == 0) {
      if (sticky != cudaSuccess) return sticky;
      return BadHandle("cudaEventDestroy", "the event");
    }
  }
  delete event;
  return sticky;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (!detail::IsLiveStream(stream)) return BadHandle("cudaEventRecord", "the stream");
  if (!IsLiveEvent(event)) return BadHandle("cudaEventRecord", "the event");
  event->recorded = true;
  event->time = std::chrono::steady_clock::now();
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (!IsLiveEvent(event)) return BadHandle("cudaEventSynchronize", "the event");
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (!IsLiveEvent(event)) return BadHandle("cudaEventQuery", "the event");
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (ms == nullptr) return detail::Fail(cudaErrorInvalidValue, "cudaEventElapsedTime: null ms");
  if (!IsLiveEvent(start) || !IsLiveEvent(end)) {
    return BadHandle("cudaEventElapsedTime", "an event");
  }
  if (!start->recorded || !end->recorded ||
      ((start->flags | end->flags) & cudaEventDisableTiming) != 0) {
    return detail::Fail(cudaErrorInvalidResourceHandle,
                        "cudaEventElapsedTime: both events must be recorded, with timing");
  }
  *ms = std::chrono::duration<float, std::milli>(end->time - start->time).count();
  return cudaSuccess;
}

}  // namespace dcf::simt
