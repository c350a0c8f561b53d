// The SIMT emulator's settings, read once from the environment:
//   DCF_SIMT_THREADS=N         OS threads that run a grid's blocks (default 1)
//   DCF_SIMT_STACK_KB=N        stack per emulated thread, KiB (default 64, minimum 16)
//   DCF_SIMT_DEVICE_MEMORY=N   simulated device memory, bytes or N{K,M,G} (default 8G)
//   DCF_SIMT_ABORT=1           abort() on a kernel violation instead of failing the launch
//                              (read at each violation, so a death test can set it)
//   DCF_SIMT_CONTEXT=asm|ucontext  fiber switch implementation (default asm on x86-64,
//                              ucontext elsewhere)
//   DCF_SIMT_SCHEDULE=linear|reverse|random:SEED  the order of open choices (schedule.h)
//   DCF_SIMT_TRACE=FILE        append one JSON line per device operation to FILE (trace.h)
//   DCF_SIMT_RACECHECK=0|1     shared-memory race detection (default 1; block_runner.h)
// A malformed value is a fatal error naming the variable: a typo must not silently test
// something else.
#pragma once

#include <cstddef>
#include <string>

#include "engine/simt/schedule.h"

namespace dcf::simt::detail {

enum class ContextKind { kAssembly, kUcontext };

struct Config {
  int worker_threads = 1;
  size_t stack_bytes = 64 * 1024;
  size_t device_memory_bytes = size_t{8} << 30;
  ContextKind context_kind = ContextKind::kAssembly;
  Schedule schedule;
  std::string trace_path;  // empty: no trace
  bool racecheck = true;
};

// Parsed on first use; thread-safe.
const Config& GetConfig();

// DCF_SIMT_ABORT, read now.
bool AbortOnViolation();

// True where the hand-written context switch exists (x86-64).
bool AssemblyContextAvailable();

}  // namespace dcf::simt::detail
