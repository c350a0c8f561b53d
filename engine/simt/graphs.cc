// Stream capture and graphs of the SIMT emulator (graphs.h; API in runtime.h).
#include "engine/simt/graphs.h"

#include <algorithm>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "engine/simt/error_state.h"
#include "engine/simt/runtime.h"
#include "engine/simt/schedule.h"
#include "engine/simt/trace.h"

namespace dcf::simt {
namespace detail {
namespace {

struct Captures {
  std::set<CaptureState*> active;  // guarded by DeviceMutex
  std::set<Graph*> graphs;
  std::set<GraphExec*> execs;
};

Captures& Get() {
  static auto* captures = new Captures();
  return *captures;
}

cudaError_t Error(cudaError_t e, const std::string& message) { return Fail(e, message); }

// Runs the nodes of `nodes` once, in a topological order the schedule picks.
void RunGraph(const std::vector<GraphNode>& nodes, uint64_t launch) {
  const Schedule s = CurrentSchedule();
  if (s.kind == ScheduleKind::kLinear) {
    for (const GraphNode& n : nodes) {
      if (StickyError() != cudaSuccess) return;
      if (n.work.run) n.work.run();
    }
    return;
  }
  std::vector<int> remaining(nodes.size());
  std::vector<std::vector<size_t>> users(nodes.size());
  for (const GraphNode& n : nodes) {
    remaining[n.index] = static_cast<int>(n.deps.size());
    for (size_t d : n.deps) users[d].push_back(n.index);
  }
  std::vector<size_t> ready;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (remaining[i] == 0) ready.push_back(i);
  }
  ScheduleRng rng(ScheduleSeed(s.seed, launch, 2));
  while (!ready.empty()) {
    size_t pick = s.kind == ScheduleKind::kReverse ? ready.size() - 1 : rng.Below(ready.size());
    const size_t i = ready[pick];
    ready.erase(ready.begin() + static_cast<long>(pick));
    if (StickyError() != cudaSuccess) return;
    if (nodes[i].work.run) nodes[i].work.run();
    for (size_t u : users[i]) {
      if (--remaining[u] == 0) ready.push_back(u);
    }
    std::sort(ready.begin(), ready.end());
  }
}

// The ancestors of `tail` (inclusive) in `g`.
std::vector<bool> Ancestors(const Graph& g, const std::vector<size_t>& tail) {
  std::vector<bool> seen(g.nodes.size(), false);
  std::vector<size_t> todo = tail;
  while (!todo.empty()) {
    const size_t n = todo.back();
    todo.pop_back();
    if (seen[n]) continue;
    seen[n] = true;
    for (size_t d : g.nodes[n]->deps) todo.push_back(d);
  }
  return seen;
}

}  // namespace

void CaptureAppendLocked(Stream* s, Work work) {
  Graph& g = *s->capture->graph;
  auto node = std::make_unique<GraphNode>();
  node->work = std::move(work);
  node->deps = s->capture_tail;
  std::sort(node->deps.begin(), node->deps.end());
  node->index = g.nodes.size();
  s->capture_tail = {node->index};
  g.nodes.push_back(std::move(node));
}

void InvalidateLocked(CaptureState& c, cudaError_t why) {
  if (c.invalidated == cudaSuccess) c.invalidated = why;
}

cudaError_t CheckUnsafeCallLocked() {
  cudaError_t result = cudaSuccess;
  for (CaptureState* c : Get().active) {
    if (c->mode == cudaStreamCaptureModeGlobal ||
        (c->mode == cudaStreamCaptureModeThreadLocal &&
         c->thread == std::this_thread::get_id())) {
      InvalidateLocked(*c, cudaErrorStreamCaptureUnsupported);
      result = cudaErrorStreamCaptureUnsupported;
    }
  }
  return result;
}

bool BlockingStreamCapturingLocked() {
  for (CaptureState* c : Get().active) {
    for (Stream* s : c->streams) {
      if ((s->flags & cudaStreamNonBlocking) == 0) return true;
    }
  }
  return false;
}

void EndCaptureLocked(CaptureState& c) {
  for (Stream* s : c.streams) {
    s->capture = nullptr;
    s->capture_tail.clear();
  }
  Get().active.erase(&c);
}

void ForgetStreamLocked(Stream* s) {
  if (s->capture == nullptr) return;
  std::vector<Stream*>& streams = s->capture->streams;
  if (s->capture->origin == s) {
    // The origin goes away: the capture can never end. Release the other streams.
    std::shared_ptr<CaptureState> keep = s->capture;
    EndCaptureLocked(*keep);
    return;
  }
  streams.erase(std::remove(streams.begin(), streams.end(), s), streams.end());
  s->capture = nullptr;
  s->capture_tail.clear();
}

}  // namespace detail

using detail::DeviceMutex;

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(DeviceMutex());
  if (stream == nullptr) {
    return detail::Error(cudaErrorStreamCaptureUnsupported,
                         "cudaStreamBeginCapture: the legacy stream cannot be captured");
  }
  if (!detail::IsLiveStreamLocked(stream)) {
    return detail::Error(cudaErrorInvalidResourceHandle,
                         "cudaStreamBeginCapture: the stream is not a live handle");
  }
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed) {
    return detail::Error(cudaErrorInvalidValue, "cudaStreamBeginCapture: bad mode");
  }
  if (stream->capture != nullptr) {
    return detail::Error(cudaErrorIllegalState,
                         "cudaStreamBeginCapture: the stream is already capturing");
  }
  auto c = std::make_shared<detail::CaptureState>();
  c->origin = stream;
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->graph = std::make_unique<Graph>();
  c->streams = {stream};
  stream->capture = c;
  stream->capture_tail.clear();
  detail::Get().active.insert(c.get());
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (graph == nullptr) return detail::Error(cudaErrorInvalidValue, "cudaStreamEndCapture: null");
  *graph = nullptr;
  std::lock_guard<std::mutex> lock(DeviceMutex());
  if (!detail::IsLiveStreamLocked(stream)) {
    return detail::Error(cudaErrorInvalidResourceHandle,
                         "cudaStreamEndCapture: the stream is not a live handle");
  }
  Stream* s = detail::Resolve(stream);
  if (s->capture == nullptr || s->capture->origin != s) {
    return detail::Error(cudaErrorStreamCaptureUnmatched,
                         "cudaStreamEndCapture: the capture was not begun on this stream");
  }
  std::shared_ptr<detail::CaptureState> c = s->capture;
  if (c->mode == cudaStreamCaptureModeThreadLocal && c->thread != std::this_thread::get_id()) {
    return detail::Error(cudaErrorStreamCaptureWrongThread,
                         "cudaStreamEndCapture: a thread-local capture ends on its own thread");
  }
  // Every stream forked into the capture must have been joined back into the origin.
  cudaError_t error = c->invalidated;
  if (error == cudaSuccess) {
    const std::vector<bool> joined = detail::Ancestors(*c->graph, s->capture_tail);
    for (Stream* other : c->streams) {
      if (other == s) continue;
      for (size_t n : other->capture_tail) {
        if (!joined[n]) error = cudaErrorStreamCaptureUnjoined;
      }
    }
  }
  detail::EndCaptureLocked(*c);
  if (error == cudaErrorStreamCaptureUnjoined) {
    return detail::Error(error,
                         "cudaStreamEndCapture: work forked into another stream was not joined "
                         "back into the origin stream (record an event there and wait for it)");
  }
  if (error != cudaSuccess) {
    return detail::Error(cudaErrorStreamCaptureInvalidated,
                         std::string("cudaStreamEndCapture: the capture was invalidated by ") +
                             cudaGetErrorName(error));
  }
  *graph = c->graph.release();
  detail::Get().graphs.insert(*graph);
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (status == nullptr) return detail::Error(cudaErrorInvalidValue, "cudaStreamIsCapturing");
  std::lock_guard<std::mutex> lock(DeviceMutex());
  if (!detail::IsLiveStreamLocked(stream)) {
    return detail::Error(cudaErrorInvalidResourceHandle,
                         "cudaStreamIsCapturing: the stream is not a live handle");
  }
  Stream* s = detail::Resolve(stream);
  if (s->legacy && detail::BlockingStreamCapturingLocked()) {
    return detail::Error(cudaErrorStreamCaptureImplicit,
                         "cudaStreamIsCapturing: the legacy stream while a blocking stream is "
                         "being captured");
  }
  if (s->capture == nullptr) {
    *status = cudaStreamCaptureStatusNone;
  } else {
    *status = s->capture->invalidated == cudaSuccess ? cudaStreamCaptureStatusActive
                                                     : cudaStreamCaptureStatusInvalidated;
  }
  return cudaSuccess;
}

cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* num_nodes) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (num_nodes == nullptr) return detail::Error(cudaErrorInvalidValue, "cudaGraphGetNodes");
  std::lock_guard<std::mutex> lock(DeviceMutex());
  if (detail::Get().graphs.count(graph) == 0) {
    return detail::Error(cudaErrorInvalidValue, "cudaGraphGetNodes: not a live graph");
  }
  const size_t n = graph->nodes.size();
  if (nodes != nullptr) {
    for (size_t i = 0; i < std::min(n, *num_nodes); ++i) nodes[i] = graph->nodes[i].get();
  }
  *num_nodes = n;
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  const cudaError_t sticky = detail::StickyError();
  {
    std::lock_guard<std::mutex> lock(DeviceMutex());
    if (detail::Get().graphs.erase(graph) == 0) {
      if (sticky != cudaSuccess) return sticky;
      return detail::Error(cudaErrorInvalidValue, "cudaGraphDestroy: not a live graph");
    }
  }
  delete graph;
  return sticky;
}

namespace {

std::shared_ptr<const std::vector<GraphNode>> Copy(const Graph& g) {
  auto nodes = std::make_shared<std::vector<GraphNode>>();
  nodes->reserve(g.nodes.size());
  for (const auto& n : g.nodes) nodes->push_back(*n);
  return nodes;
}

}  // namespace

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph,
                                 unsigned long long flags) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (exec == nullptr) return detail::Error(cudaErrorInvalidValue, "cudaGraphInstantiate: null");
  *exec = nullptr;
  if (flags != 0) {
    return detail::Error(cudaErrorInvalidValue,
                         "cudaGraphInstantiate: the emulator supports flags 0 only");
  }
  std::lock_guard<std::mutex> lock(DeviceMutex());
  if (detail::Get().graphs.count(graph) == 0) {
    return detail::Error(cudaErrorInvalidValue, "cudaGraphInstantiate: not a live graph");
  }
  auto* e = new GraphExec();
  e->nodes = Copy(*graph);
  detail::Get().execs.insert(e);
  *exec = e;
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  const cudaError_t sticky = detail::StickyError();
  {
    std::lock_guard<std::mutex> lock(DeviceMutex());
    if (detail::Get().execs.erase(exec) == 0) {
      if (sticky != cudaSuccess) return sticky;
      return detail::Error(cudaErrorInvalidValue, "cudaGraphExecDestroy: not a live graph exec");
    }
  }
  delete exec;  // a queued launch keeps its nodes alive
  return sticky;
}

cudaError_t cudaGraphExecUpdate(cudaGraphExec_t exec, cudaGraph_t graph,
                                cudaGraphExecUpdateResultInfo* info) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(DeviceMutex());
  if (detail::Get().execs.count(exec) == 0 || detail::Get().graphs.count(graph) == 0) {
    return detail::Error(cudaErrorInvalidValue, "cudaGraphExecUpdate: not a live graph (exec)");
  }
  cudaGraphExecUpdateResult result = cudaGraphExecUpdateSuccess;
  cudaGraphNode_t bad = nullptr;
  const std::vector<GraphNode>& old = *exec->nodes;
  if (old.size() != graph->nodes.size()) {
    result = cudaGraphExecUpdateErrorTopologyChanged;
  } else {
    for (size_t i = 0; i < old.size() && result == cudaGraphExecUpdateSuccess; ++i) {
      const GraphNode& a = old[i];
      const GraphNode& b = *graph->nodes[i];
      bad = graph->nodes[i].get();
      if (a.deps != b.deps) {
        result = cudaGraphExecUpdateErrorTopologyChanged;
      } else if (a.work.kind != b.work.kind) {
        result = cudaGraphExecUpdateErrorNodeTypeChanged;
      } else if (a.work.kind == detail::Work::Kind::kKernel && a.work.function != b.work.function) {
        result = cudaGraphExecUpdateErrorFunctionChanged;
      } else if (a.work.kind == detail::Work::Kind::kMemcpy &&
                 a.work.direction != b.work.direction) {
        result = cudaGraphExecUpdateErrorParametersChanged;
      }
    }
  }
  if (info != nullptr) {
    info->result = result;
    info->errorNode = result == cudaGraphExecUpdateSuccess ? nullptr : bad;
    info->errorFromNode = nullptr;
  }
  if (result != cudaGraphExecUpdateSuccess) {
    return detail::Error(cudaErrorGraphExecUpdateFailure,
                         "cudaGraphExecUpdate: the graph differs in topology, node types, "
                         "kernels or copy directions from the executable graph");
  }
  exec->nodes = Copy(*graph);
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(DeviceMutex());
  if (detail::Get().execs.count(exec) == 0) {
    return detail::Error(cudaErrorInvalidValue, "cudaGraphLaunch: not a live graph exec");
  }
  if (!detail::IsLiveStreamLocked(stream)) {
    return detail::Error(cudaErrorInvalidResourceHandle,
                         "cudaGraphLaunch: the stream is not a live handle");
  }
  Stream* s = detail::Resolve(stream);
  if (s->capture != nullptr) {
    return detail::Error(cudaErrorNotSupported,
                         "cudaGraphLaunch: capturing a graph launch (a child graph) is not "
                         "supported by the emulator");
  }
  std::shared_ptr<const std::vector<GraphNode>> nodes = exec->nodes;
  std::vector<const detail::Work*> traced;
  for (const GraphNode& n : *nodes) traced.push_back(&n.work);
  detail::TraceGraph(traced);
  detail::Work w;
  w.kind = detail::Work::Kind::kGraph;
  w.nodes = nodes->size();
  w.run = [nodes] { detail::RunGraph(*nodes, detail::NextScheduleSerial()); };
  // Launches of one executable graph are ordered, whatever streams they go to.
  std::vector<uint64_t> deps;
  if (detail::PendingLocked(exec->last_launch)) deps.push_back(exec->last_launch);
  uint64_t id = 0;
  if (cudaError_t e = detail::SubmitLocked(s, std::move(w), std::move(deps), &id);
      e != cudaSuccess) {
    return detail::Error(e, "cudaGraphLaunch: the legacy stream during a capture");
  }
  exec->last_launch = id;
  return cudaSuccess;
}

}  // namespace dcf::simt
