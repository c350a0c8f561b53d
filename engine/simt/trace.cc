#include "engine/simt/trace.h"

#include <cstdio>
#include <mutex>
#include <string>

#include "engine/simt/config.h"
#include "engine/simt/device_queue.h"
#include "engine/simt/simt_testing.h"

namespace dcf::simt {
namespace {

struct TraceState {
  std::mutex mu;
  bool opened = false;     // guarded by mu: the path has been decided
  std::FILE* file = nullptr;  // guarded by mu
};

TraceState& State() {
  static auto* state = new TraceState();  // never destroyed: traces may end at exit
  return *state;
}

// Requires mu. Opens DCF_SIMT_TRACE on first use.
std::FILE* FileLocked(TraceState& s) {
  if (!s.opened) {
    s.opened = true;
    const std::string& path = detail::GetConfig().trace_path;
    if (!path.empty()) {
      s.file = std::fopen(path.c_str(), "a");
      if (s.file == nullptr) {
        std::fprintf(stderr, "dcf simt: cannot open DCF_SIMT_TRACE file '%s'\n", path.c_str());
        std::abort();
      }
    }
  }
  return s.file;
}

void Emit(const std::string& line) {
  TraceState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  std::FILE* f = FileLocked(s);
  if (f == nullptr) return;
  std::fputs(line.c_str(), f);
  std::fputc('\n', f);
  std::fflush(f);
}

std::string Quoted(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof(esc), "\\u%04x", c);
      out += esc;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string Dims(dim3 d) {
  return "[" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + "]";
}

const char* Direction(cudaMemcpyKind k) {
  switch (k) {
    case cudaMemcpyHostToDevice:
      return "h2d";
    case cudaMemcpyDeviceToHost:
      return "d2h";
    case cudaMemcpyHostToHost:
      return "h2h";
    default:
      return "d2d";
  }
}

const char* Bool(bool b) { return b ? "true" : "false"; }

}  // namespace

void SetTraceFile(const std::string& path) {
  TraceState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.file != nullptr) std::fclose(s.file);
  s.file = nullptr;
  s.opened = true;
  if (path.empty()) return;
  s.file = std::fopen(path.c_str(), "a");
  if (s.file == nullptr) {
    std::fprintf(stderr, "dcf simt: cannot open trace file '%s'\n", path.c_str());
    std::abort();
  }
}

void TraceStep(int tokens, int seqs) {
  if (!detail::TraceEnabled()) return;
  Emit("{\"kind\":\"step\",\"tokens\":" + std::to_string(tokens) +
       ",\"seqs\":" + std::to_string(seqs) + "}");
}

namespace detail {

bool TraceEnabled() {
  TraceState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  return FileLocked(s) != nullptr;
}

namespace {

// The line of `w`, or "" for work without one.
std::string WorkLine(const Work& w, bool async, bool in_graph) {
  std::string line;
  switch (w.kind) {
    case Work::Kind::kKernel:
      line = "{\"kind\":\"kernel\",\"name\":" + Quoted(w.name) + ",\"grid\":" + Dims(w.grid) +
             ",\"block\":" + Dims(w.block) + ",\"smem\":" + std::to_string(w.smem);
      break;
    case Work::Kind::kGemm:
      line = "{\"kind\":\"gemm\",\"m\":" + std::to_string(w.m) + ",\"n\":" + std::to_string(w.n) +
             ",\"k\":" + std::to_string(w.k);
      break;
    case Work::Kind::kMemcpy:
      line = std::string("{\"kind\":\"memcpy\",\"dir\":\"") + Direction(w.direction) +
             "\",\"bytes\":" + std::to_string(w.bytes) + ",\"async\":" + Bool(async) +
             ",\"pinned\":" + Bool(w.host_pinned);
      break;
    case Work::Kind::kMemset:
      line = "{\"kind\":\"memset\",\"bytes\":" + std::to_string(w.bytes) +
             ",\"async\":" + Bool(async);
      break;
    default:
      return "";  // markers and graph launches have their own lines
  }
  if (in_graph) line += ",\"in_graph\":true";
  return line + "}";
}

}  // namespace

void TraceWork(const Work& w, bool async) {
  if (!TraceEnabled()) return;
  const std::string line = WorkLine(w, async, false);
  if (!line.empty()) Emit(line);
}

void TraceCall(const char* kind, const char* call) {
  if (!TraceEnabled()) return;
  Emit(std::string("{\"kind\":\"") + kind + "\",\"call\":\"" + call + "\"}");
}

void TraceGraph(const std::vector<const Work*>& nodes) {
  if (!TraceEnabled()) return;
  // One write, so that another thread's lines cannot come between the graph and its nodes.
  std::string text = "{\"kind\":\"graph\",\"nodes\":" + std::to_string(nodes.size()) + "}";
  for (const Work* w : nodes) {
    const std::string line = WorkLine(*w, true, true);
    if (!line.empty()) text += "\n" + line;
  }
  Emit(text);
}

}  // namespace detail
}  // namespace dcf::simt
