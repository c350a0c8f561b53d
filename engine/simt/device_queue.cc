#include "engine/simt/device_queue.h"

#include <algorithm>
#include <mutex>
#include <set>
#include <unordered_map>
#include <utility>

#include "engine/simt/error_state.h"
#include "engine/simt/graphs.h"
#include "engine/simt/schedule.h"
#include "engine/simt/simt_testing.h"

namespace dcf::simt::detail {
namespace {

struct Device {
  std::mutex mu;      // everything below, and Stream/Event state
  std::mutex run_mu;  // one host thread runs work at a time
  Stream legacy;
  std::set<Stream*> streams;
  std::set<Event*> events;
  uint64_t next_id = 1;
  std::unordered_map<uint64_t, Stream*> pending;  // incomplete operation -> its stream
  Device() { legacy.legacy = true; }
};

Device& Get() {
  static auto* device = new Device();  // never destroyed: streams may be used during exit
  return *device;
}

void Execute(Op& op) {
  // After a device fault nothing more runs (as on a GPU, where the context is lost).
  if (StickyError() != cudaSuccess) return;
  if (op.work.run) op.work.run();
}

// Picks which of `deps` (incomplete, in issue order) to resolve first.
uint64_t Choose(const std::vector<uint64_t>& deps) {
  const Schedule s = CurrentSchedule();
  switch (s.kind) {
    case ScheduleKind::kLinear:
      return deps.front();
    case ScheduleKind::kReverse:
      return deps.back();
    case ScheduleKind::kRandom:
      return deps[ScheduleRng(ScheduleSeed(s.seed, NextScheduleSerial(), 1)).Below(deps.size())];
  }
  return deps.front();
}

// Requires run_mu, not mu.
void RunUntilHoldingRunMutex(Device& d, uint64_t target) {
  while (true) {
    std::unique_lock<std::mutex> lock(d.mu);
    const auto it = d.pending.find(target);
    if (it == d.pending.end()) return;
    Stream* s = it->second;
    Op& front = s->queue.front();
    std::vector<uint64_t> waiting;
    for (uint64_t dep : front.deps) {
      if (d.pending.count(dep) != 0) waiting.push_back(dep);
    }
    if (!waiting.empty()) {
      std::sort(waiting.begin(), waiting.end());
      const uint64_t next = Choose(waiting);
      lock.unlock();
      RunUntilHoldingRunMutex(d, next);
      continue;
    }
    Op op = std::move(front);
    s->queue.pop_front();
    lock.unlock();
    Execute(op);
    lock.lock();
    d.pending.erase(op.id);
  }
}

}  // namespace

std::mutex& DeviceMutex() { return Get().mu; }
Stream& LegacyStream() { return Get().legacy; }

bool IsLiveStreamLocked(cudaStream_t stream) {
  return stream == nullptr || Get().streams.count(stream) != 0;
}
bool IsLiveEventLocked(cudaEvent_t event) { return Get().events.count(event) != 0; }
void RegisterStream(Stream* stream) { Get().streams.insert(stream); }
bool UnregisterStream(Stream* stream) { return Get().streams.erase(stream) != 0; }
void RegisterEvent(Event* event) { Get().events.insert(event); }
bool UnregisterEvent(Event* event) { return Get().events.erase(event) != 0; }

std::vector<Stream*> AllStreamsLocked() {
  Device& d = Get();
  std::vector<Stream*> all = {&d.legacy};
  all.insert(all.end(), d.streams.begin(), d.streams.end());
  return all;
}

cudaError_t SubmitLocked(Stream* s, Work work, std::vector<uint64_t> deps, uint64_t* op_id) {
  Device& d = Get();
  if (op_id != nullptr) *op_id = 0;
  if (s->capture != nullptr) {
    CaptureAppendLocked(s, std::move(work));
    return cudaSuccess;
  }
  if (s->legacy && BlockingStreamCapturingLocked()) {
    for (Stream* other : d.streams) {
      if (other->capture != nullptr && (other->flags & cudaStreamNonBlocking) == 0) {
        InvalidateLocked(*other->capture, cudaErrorStreamCaptureImplicit);
      }
    }
    return cudaErrorStreamCaptureImplicit;
  }
  // The legacy stream's implicit synchronisation with blocking streams.
  if (s->legacy) {
    for (Stream* other : d.streams) {
      if ((other->flags & cudaStreamNonBlocking) == 0 && d.pending.count(other->last_op) != 0) {
        deps.push_back(other->last_op);
      }
    }
  } else if ((s->flags & cudaStreamNonBlocking) == 0 && d.pending.count(d.legacy.last_op) != 0) {
    deps.push_back(d.legacy.last_op);
  }
  Op op;
  op.id = d.next_id++;
  op.deps = std::move(deps);
  op.work = std::move(work);
  s->last_op = op.id;
  d.pending.emplace(op.id, s);
  if (op_id != nullptr) *op_id = op.id;
  s->queue.push_back(std::move(op));
  return cudaSuccess;
}

cudaError_t Submit(cudaStream_t stream, Work work, uint64_t* op_id) {
  std::lock_guard<std::mutex> lock(Get().mu);
  return SubmitLocked(Resolve(stream), std::move(work), {}, op_id);
}

void RunUntil(uint64_t id) {
  Device& d = Get();
  if (id == 0) return;
  std::lock_guard<std::mutex> run(d.run_mu);
  RunUntilHoldingRunMutex(d, id);
}

void RunStream(cudaStream_t stream) {
  uint64_t last = 0;
  {
    std::lock_guard<std::mutex> lock(Get().mu);
    last = Resolve(stream)->last_op;
  }
  RunUntil(last);
}

void RunAll() {
  Device& d = Get();
  std::lock_guard<std::mutex> run(d.run_mu);
  while (true) {
    std::vector<uint64_t> lasts;
    {
      std::lock_guard<std::mutex> lock(d.mu);
      for (Stream* s : AllStreamsLocked()) {
        if (d.pending.count(s->last_op) != 0) lasts.push_back(s->last_op);
      }
      if (lasts.empty()) return;
      std::sort(lasts.begin(), lasts.end());
    }
    uint64_t next;
    {
      std::lock_guard<std::mutex> lock(d.mu);
      next = Choose(lasts);
    }
    RunUntilHoldingRunMutex(d, next);
  }
}

bool PendingLocked(uint64_t id) { return id != 0 && Get().pending.count(id) != 0; }

bool Pending(uint64_t id) {
  std::lock_guard<std::mutex> lock(Get().mu);
  return PendingLocked(id);
}

bool StreamPending(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(Get().mu);
  return PendingLocked(Resolve(stream)->last_op);
}

}  // namespace dcf::simt::detail

namespace dcf::simt {

void RunQueuedWork() { detail::RunAll(); }

}  // namespace dcf::simt
