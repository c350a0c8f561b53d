#include "proto/rpc/grpc_log.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "engine/common/log_text.h"
#include "engine/common/logging.h"

namespace dcf::rpc {
namespace {

constexpr size_t kMaxMessageBytes = 2048;

struct Site {
  double tokens = kBurst;
  absl::Time refilled = absl::InfinitePast();
  long dropped = 0;
};

struct Sink {
  absl::Mutex mu;
  bool print ABSL_GUARDED_BY(mu) = true;
  bool capturing ABSL_GUARDED_BY(mu) = false;
  std::vector<GrpcLogLine> captured ABSL_GUARDED_BY(mu);
  std::string first_error ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, Site> sites ABSL_GUARDED_BY(mu);
};

Sink& TheSink() {
  static Sink* sink = new Sink;
  return *sink;
}

LogLevel LevelOf(gpr_log_severity severity) {
  switch (severity) {
    case GPR_LOG_SEVERITY_DEBUG:
      return LogLevel::kDebug;
    case GPR_LOG_SEVERITY_INFO:
      return LogLevel::kInfo;
    default:
      return LogLevel::kError;
  }
}

// gRPC's statuses read "CODE:description {key:value, ...}": the part a person needs.
absl::string_view Description(absl::string_view message) {
  const size_t brace = message.find(" {");
  if (brace != absl::string_view::npos) message = message.substr(0, brace);
  const size_t colon = message.find(':');
  if (colon != absl::string_view::npos && colon > 0 &&
      std::all_of(message.begin(), message.begin() + colon,
                  [](char c) { return (c >= 'A' && c <= 'Z') || c == '_'; })) {
    message.remove_prefix(colon + 1);
  }
  return message;
}

// Takes one line of `site`'s budget; returns false to drop it. Sets `*dropped` to the lines
// dropped since the last one written.
bool Admit(Sink& sink, const std::string& site, long* dropped)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(sink.mu) {
  Site& s = sink.sites[site];
  const absl::Time now = absl::Now();
  if (s.refilled != absl::InfinitePast()) {
    s.tokens = std::min<double>(kBurst, s.tokens + (now - s.refilled) / kRefill);
  }
  s.refilled = now;
  if (s.tokens < 1) {
    ++s.dropped;
    return false;
  }
  s.tokens -= 1;
  *dropped = std::exchange(s.dropped, 0);
  return true;
}

void Write(Sink& sink, const GrpcLogLine& line) ABSL_EXCLUSIVE_LOCKS_REQUIRED(sink.mu) {
  const LogLevel level = LevelOf(line.severity);
  if (level < MinLogLevel()) return;
  long dropped = 0;
  if (!Admit(sink, absl::StrCat(line.file, ":", line.line), &dropped)) return;
  LogMessage message(level, line.file.c_str(), line.line);
  message.stream() << "gRPC: " << LogText(line.message, kMaxMessageBytes);
  if (dropped > 0) {
    message.stream() << " (" << dropped << " more line" << (dropped == 1 ? "" : "s")
                     << " from here dropped: at most " << kBurst << " at once, then one per "
                     << absl::FormatDuration(kRefill) << ")";
  }
}

void Collect(gpr_log_func_args* args) {
  GrpcLogLine line;
  line.file = args->file != nullptr ? args->file : "grpc";
  line.line = args->line;
  line.severity = args->severity;
  line.message = args->message != nullptr ? args->message : "";
  Sink& sink = TheSink();
  absl::MutexLock lock(&sink.mu);
  if (line.severity == GPR_LOG_SEVERITY_ERROR && sink.first_error.empty()) {
    sink.first_error = LogText(Description(line.message), kMaxMessageBytes);
  }
  if (sink.capturing) {
    if (sink.captured.size() < 1000) sink.captured.push_back(std::move(line));
    return;
  }
  if (sink.print) Write(sink, line);
}

}  // namespace

void InstallGrpcLogSink(bool print) {
  Sink& sink = TheSink();
  {
    absl::MutexLock lock(&sink.mu);
    sink.print = print || std::getenv("GRPC_VERBOSITY") != nullptr ||
                 std::getenv("GRPC_TRACE") != nullptr;
    sink.first_error.clear();
  }
  gpr_set_log_function(&Collect);
}

std::string FirstGrpcError() {
  Sink& sink = TheSink();
  absl::MutexLock lock(&sink.mu);
  return sink.first_error;
}

void WriteGrpcLogLine(const GrpcLogLine& line) {
  Sink& sink = TheSink();
  absl::MutexLock lock(&sink.mu);
  Write(sink, line);
}

GrpcLogCapture::GrpcLogCapture() {
  Sink& sink = TheSink();
  absl::MutexLock lock(&sink.mu);
  sink.capturing = true;
  sink.captured.clear();
}

GrpcLogCapture::~GrpcLogCapture() {
  if (active_) Stop();
}

std::vector<GrpcLogLine> GrpcLogCapture::Stop() {
  active_ = false;
  Sink& sink = TheSink();
  absl::MutexLock lock(&sink.mu);
  sink.capturing = false;
  return std::exchange(sink.captured, {});
}

std::string GrpcLogCapture::BindError(const std::vector<GrpcLogLine>& lines) {
  for (const GrpcLogLine& l : lines) {
    const absl::string_view m = l.message;
    const size_t at = m.find("os_error");
    if (at == absl::string_view::npos) continue;
    const size_t open = m.find('"', at);
    const size_t close = open == absl::string_view::npos ? open : m.find('"', open + 1);
    if (close != absl::string_view::npos) {
      return LogText(m.substr(open + 1, close - open - 1), kMaxMessageBytes);
    }
  }
  for (const GrpcLogLine& l : lines) {
    if (l.severity == GPR_LOG_SEVERITY_ERROR) {
      return LogText(Description(l.message), kMaxMessageBytes);
    }
  }
  return "";
}

}  // namespace dcf::rpc
