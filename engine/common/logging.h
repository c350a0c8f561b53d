// The project's one logging facility (Debian's Abseil has no absl/log).
// Thread-safe: each message is formatted into one line and written with a single fwrite.
// Output goes to stderr as: "<RFC3339 UTC time> <LEVEL> <file>:<line>] message".
#pragma once

#include <sstream>
#include <string>

namespace dcf {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

// Messages below this level are dropped. Default kInfo; DCF_LOG_LEVEL=debug|info|warning|error
// in the environment overrides it at first use.
void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();  // writes the line; aborts for kFatal
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

// Swallows the stream when the level is disabled.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace dcf

#define DCF_LOG(level)                                                      \
  (::dcf::LogLevel::k##level < ::dcf::MinLogLevel())                        \
      ? (void)0                                                             \
      : ::dcf::LogVoidify() & ::dcf::LogMessage(::dcf::LogLevel::k##level, \
                                                __FILE__, __LINE__)         \
                                  .stream()

// Aborts with a message when `cond` is false. The switch/else form keeps a following
// `else` of the caller attached to the caller's `if`.
#define DCF_CHECK(cond)  \
  switch (0)             \
  case 0:                \
  default:               \
    if (cond) {          \
    } else               \
      DCF_LOG(Fatal) << "Check failed: " #cond " "
