// Streams and events of the SIMT emulator over the device queues (device_queue.h): a stream
// is a queue, an event a marker operation in one; synchronisation runs the queued work it
// waits for, a query reports cudaErrorNotReady when work was pending (and lets it finish).
#include <chrono>
#include <mutex>
#include <string>

#include "engine/simt/device_queue.h"
#include "engine/simt/error_state.h"
#include "engine/simt/graphs.h"
#include "engine/simt/runtime.h"
#include "engine/simt/stream_registry.h"
#include "engine/simt/trace.h"

namespace dcf::simt {
namespace {

using detail::DeviceMutex;

cudaError_t BadHandle(const char* call, const char* what) {
  return detail::Fail(cudaErrorInvalidResourceHandle,
                      std::string(call) + ": " + what + " is not a live handle");
}

cudaError_t CaptureError(cudaError_t e, const char* call, const char* what) {
  return detail::Fail(e, std::string(call) + ": " + what);
}

// The sticky error after running work, or `otherwise`.
cudaError_t AfterRun(cudaError_t otherwise = cudaSuccess) {
  if (const cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  return otherwise;
}

}  // namespace

namespace detail {
bool IsLiveStream(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(DeviceMutex());
  return IsLiveStreamLocked(stream);
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
  *stream = new Stream();
  (*stream)->flags = flags;
  std::lock_guard<std::mutex> lock(DeviceMutex());
  detail::RegisterStream(*stream);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  const cudaError_t sticky = detail::StickyError();
  {
    std::lock_guard<std::mutex> lock(DeviceMutex());
    if (stream == nullptr || !detail::IsLiveStreamLocked(stream)) {
      if (sticky != cudaSuccess) return sticky;
      return BadHandle("cudaStreamDestroy", "the stream");
    }
  }
  // CUDA finishes the stream's work in the background and then releases it: run it now.
  detail::RunStream(stream);
  {
    std::lock_guard<std::mutex> lock(DeviceMutex());
    if (stream->capture != nullptr) {
      detail::InvalidateLocked(*stream->capture, cudaErrorStreamCaptureUnjoined);
    }
    detail::ForgetStreamLocked(stream);
    detail::UnregisterStream(stream);
  }
  delete stream;
  return sticky;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  {
    std::lock_guard<std::mutex> lock(DeviceMutex());
    if (!detail::IsLiveStreamLocked(stream)) return BadHandle("cudaStreamSynchronize", "the stream");
    Stream* s = detail::Resolve(stream);
    if (s->capture != nullptr) {
      detail::InvalidateLocked(*s->capture, cudaErrorStreamCaptureUnsupported);
      return CaptureError(cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize",
                          "the stream is being captured");
    }
    if (s->legacy && detail::BlockingStreamCapturingLocked()) {
      return CaptureError(cudaErrorStreamCaptureImplicit, "cudaStreamSynchronize",
                          "the legacy stream while a blocking stream is being captured");
    }
  }
  detail::TraceCall("sync", "cudaStreamSynchronize");
  detail::RunStream(stream);
  return AfterRun();
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  {
    std::lock_guard<std::mutex> lock(DeviceMutex());
    if (!detail::IsLiveStreamLocked(stream)) return BadHandle("cudaStreamQuery", "the stream");
    Stream* s = detail::Resolve(stream);
    if (s->capture != nullptr) {
      detail::InvalidateLocked(*s->capture, cudaErrorStreamCaptureUnsupported);
      return CaptureError(cudaErrorStreamCaptureUnsupported, "cudaStreamQuery",
                          "the stream is being captured");
    }
  }
  detail::TraceCall("query", "cudaStreamQuery");
  if (!detail::StreamPending(stream)) return cudaSuccess;
  // Not done at the call; the device finishes it meanwhile.
  detail::RunStream(stream);
  return AfterRun(cudaErrorNotReady);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(DeviceMutex());
  if (!detail::IsLiveStreamLocked(stream)) return BadHandle("cudaStreamWaitEvent", "the stream");
  if (!detail::IsLiveEventLocked(event)) return BadHandle("cudaStreamWaitEvent", "the event");
  if (flags != 0) return detail::Fail(cudaErrorInvalidValue, "cudaStreamWaitEvent: flags");
  Stream* s = detail::Resolve(stream);
  detail::TraceCall("event", "wait");
  if (event->capture != nullptr) {
    // Waiting on a record of an active capture joins the stream into that capture (fork).
    detail::CaptureState& c = *event->capture;
    if (s->capture != nullptr && s->capture != event->capture) {
      return CaptureError(cudaErrorStreamCaptureIsolation, "cudaStreamWaitEvent",
                          "the stream and the event belong to different captures");
    }
    if (s->legacy) {
      detail::InvalidateLocked(c, cudaErrorStreamCaptureImplicit);
      return CaptureError(cudaErrorStreamCaptureImplicit, "cudaStreamWaitEvent",
                          "the legacy stream cannot join a capture");
    }
    if (s->capture == nullptr) {
      s->capture = event->capture;
      s->capture_tail.clear();
      c.streams.push_back(s);
    }
    for (size_t n : event->capture_tail) {
      if (std::find(s->capture_tail.begin(), s->capture_tail.end(), n) == s->capture_tail.end()) {
        s->capture_tail.push_back(n);
      }
    }
    return cudaSuccess;
  }
  if (s->capture != nullptr) {
    if (!event->recorded || !detail::PendingLocked(event->op)) {
      return cudaSuccess;  // nothing to wait for: no dependency crosses the capture
    }
    detail::InvalidateLocked(*s->capture, cudaErrorStreamCaptureIsolation);
    return CaptureError(cudaErrorStreamCaptureIsolation, "cudaStreamWaitEvent",
                        "a capturing stream waits for uncaptured work");
  }
  std::vector<uint64_t> deps;
  if (event->recorded && detail::PendingLocked(event->op)) deps.push_back(event->op);
  detail::Work w;
  w.kind = detail::Work::Kind::kEventWait;
  return detail::SubmitLocked(s, std::move(w), std::move(deps), nullptr);
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (event == nullptr || (flags & ~(cudaEventBlockingSync | cudaEventDisableTiming)) != 0) {
    return detail::Fail(cudaErrorInvalidValue, "cudaEventCreateWithFlags: bad argument");
  }
  *event = new Event();
  (*event)->flags = flags;
  std::lock_guard<std::mutex> lock(DeviceMutex());
  detail::RegisterEvent(*event);
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  const cudaError_t sticky = detail::StickyError();
  {
    std::lock_guard<std::mutex> lock(DeviceMutex());
    if (event == nullptr || !detail::UnregisterEvent(event)) {
      if (sticky != cudaSuccess) return sticky;
      return BadHandle("cudaEventDestroy", "the event");
    }
  }
  delete event;  // a queued record keeps its EventTime alive
  return sticky;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(DeviceMutex());
  if (!detail::IsLiveStreamLocked(stream)) return BadHandle("cudaEventRecord", "the stream");
  if (!detail::IsLiveEventLocked(event)) return BadHandle("cudaEventRecord", "the event");
  Stream* s = detail::Resolve(stream);
  detail::TraceCall("event", "record");
  if (s->capture != nullptr) {
    // A record inside a capture is a point of the graph others may wait for, not a node.
    event->capture = s->capture;
    event->capture_tail = s->capture_tail;
    event->recorded = false;
    event->op = 0;
    return cudaSuccess;
  }
  auto time = std::make_shared<EventTime>();
  detail::Work w;
  w.kind = detail::Work::Kind::kEventRecord;
  w.run = [time] {
    time->time = std::chrono::steady_clock::now();
    time->done = true;
  };
  uint64_t id = 0;
  if (cudaError_t e = detail::SubmitLocked(s, std::move(w), {}, &id); e != cudaSuccess) {
    return CaptureError(e, "cudaEventRecord", "the legacy stream during a capture");
  }
  event->capture = nullptr;
  event->capture_tail.clear();
  event->recorded = true;
  event->op = id;
  event->time = std::move(time);
  return cudaSuccess;
}

namespace {

// Checks `event` for a synchronize or query; returns the record to wait for (0: none).
cudaError_t EventTarget(const char* call, cudaEvent_t event, uint64_t* op) {
  std::lock_guard<std::mutex> lock(DeviceMutex());
  if (!detail::IsLiveEventLocked(event)) return BadHandle(call, "the event");
  if (event->capture != nullptr) {
    detail::InvalidateLocked(*event->capture, cudaErrorCapturedEvent);
    return CaptureError(cudaErrorCapturedEvent, call, "the event was recorded in a capture");
  }
  *op = event->recorded ? event->op : 0;
  return cudaSuccess;
}

}  // namespace

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  uint64_t op = 0;
  if (cudaError_t e = EventTarget("cudaEventSynchronize", event, &op); e != cudaSuccess) return e;
  detail::TraceCall("sync", "cudaEventSynchronize");
  detail::RunUntil(op);
  return AfterRun();
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  uint64_t op = 0;
  if (cudaError_t e = EventTarget("cudaEventQuery", event, &op); e != cudaSuccess) return e;
  detail::TraceCall("query", "cudaEventQuery");
  if (!detail::Pending(op)) return cudaSuccess;
  detail::RunUntil(op);
  return AfterRun(cudaErrorNotReady);
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (ms == nullptr) return detail::Fail(cudaErrorInvalidValue, "cudaEventElapsedTime: null ms");
  std::lock_guard<std::mutex> lock(DeviceMutex());
  if (!detail::IsLiveEventLocked(start) || !detail::IsLiveEventLocked(end)) {
    return BadHandle("cudaEventElapsedTime", "an event");
  }
  if (!start->recorded || !end->recorded ||
      ((start->flags | end->flags) & cudaEventDisableTiming) != 0) {
    return detail::Fail(cudaErrorInvalidResourceHandle,
                        "cudaEventElapsedTime: both events must be recorded, with timing");
  }
  if (!start->time->done || !end->time->done) {
    return detail::Fail(cudaErrorNotReady, "cudaEventElapsedTime: an event has not completed");
  }
  *ms = std::chrono::duration<float, std::milli>(end->time->time - start->time->time).count();
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  {
    std::lock_guard<std::mutex> lock(DeviceMutex());
    if (cudaError_t e = detail::CheckUnsafeCallLocked(); e != cudaSuccess) {
      return CaptureError(e, "cudaDeviceSynchronize", "a stream is being captured");
    }
  }
  detail::TraceCall("sync", "cudaDeviceSynchronize");
  detail::RunAll();
  return AfterRun();
}

}  // namespace dcf::simt
