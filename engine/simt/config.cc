#include "engine/simt/config.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace dcf::simt::detail {
namespace {

[[noreturn]] void BadValue(const char* name, const char* value, const char* expected) {
  std::fprintf(stderr, "dcf simt: environment variable %s='%s' is invalid: expected %s\n", name,
               value, expected);
  std::abort();
}

// Parses a positive integer with an optional K/M/G suffix (powers of 1024).
size_t ParseSize(const char* name, const char* value, bool allow_suffix) {
  errno = 0;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(value, &end, 10);
  if (end == value || errno != 0 || n == 0 || value[0] == '-') {
    BadValue(name, value,
             allow_suffix ? "a positive size such as 4096, 512M or 8G" : "a positive integer");
  }
  unsigned long long scale = 1;
  const std::string suffix(end);
  if (allow_suffix && (suffix == "K" || suffix == "KiB")) {
    scale = 1ull << 10;
  } else if (allow_suffix && (suffix == "M" || suffix == "MiB")) {
    scale = 1ull << 20;
  } else if (allow_suffix && (suffix == "G" || suffix == "GiB")) {
    scale = 1ull << 30;
  } else if (!suffix.empty()) {
    BadValue(name, value,
             allow_suffix ? "a positive size such as 4096, 512M or 8G" : "a positive integer");
  }
  return static_cast<size_t>(n * scale);
}

Config ReadConfig() {
  Config config;
  config.context_kind =
      AssemblyContextAvailable() ? ContextKind::kAssembly : ContextKind::kUcontext;
  if (const char* v = std::getenv("DCF_SIMT_THREADS")) {
    const size_t n = ParseSize("DCF_SIMT_THREADS", v, false);
    if (n > 1024) BadValue("DCF_SIMT_THREADS", v, "1..1024");
    config.worker_threads = static_cast<int>(n);
  }
  if (const char* v = std::getenv("DCF_SIMT_STACK_KB")) {
    const size_t kb = ParseSize("DCF_SIMT_STACK_KB", v, false);
    if (kb < 16 || kb > 64 * 1024) BadValue("DCF_SIMT_STACK_KB", v, "16..65536");
    config.stack_bytes = kb * 1024;
  }
  if (const char* v = std::getenv("DCF_SIMT_DEVICE_MEMORY")) {
    config.device_memory_bytes = ParseSize("DCF_SIMT_DEVICE_MEMORY", v, true);
  }
  if (const char* v = std::getenv("DCF_SIMT_CONTEXT")) {
    if (std::strcmp(v, "ucontext") == 0) {
      config.context_kind = ContextKind::kUcontext;
    } else if (std::strcmp(v, "asm") == 0 && AssemblyContextAvailable()) {
      config.context_kind = ContextKind::kAssembly;
    } else {
      BadValue("DCF_SIMT_CONTEXT", v,
               AssemblyContextAvailable() ? "asm or ucontext" : "ucontext (no asm switch here)");
    }
  }
  if (const char* v = std::getenv("DCF_SIMT_SCHEDULE")) {
    if (!ParseSchedule(v, &config.schedule)) {
      BadValue("DCF_SIMT_SCHEDULE", v, "linear, reverse or random:SEED (SEED a decimal integer)");
    }
  }
  if (const char* v = std::getenv("DCF_SIMT_TRACE")) config.trace_path = v;
  if (const char* v = std::getenv("DCF_SIMT_RACECHECK")) {
    if (std::strcmp(v, "0") == 0) {
      config.racecheck = false;
    } else if (std::strcmp(v, "1") != 0) {
      BadValue("DCF_SIMT_RACECHECK", v, "0 or 1");
    }
  }
  return config;
}

}  // namespace

const Config& GetConfig() {
  static const Config config = ReadConfig();
  return config;
}

bool AbortOnViolation() {
  const char* v = std::getenv("DCF_SIMT_ABORT");
  if (v == nullptr || v[0] == '\0' || std::strcmp(v, "0") == 0) return false;
  if (std::strcmp(v, "1") == 0) return true;
  BadValue("DCF_SIMT_ABORT", v, "0 or 1");
}

bool AssemblyContextAvailable() {
#if defined(__x86_64__)
  return true;
#else
  return false;
#endif
}

}  // namespace dcf::simt::detail
