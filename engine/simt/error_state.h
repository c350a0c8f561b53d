// The SIMT emulator's error state, shared by every runtime stand-in:
// - the sticky error (process-wide): set by a kernel violation or InjectStickyError; while
//   set, every runtime call returns it;
// - each host thread's last error: set by a failing call, read by cudaGetLastError (which
//   clears it) and cudaPeekAtLastError;
// - the last error message (process-wide), for LastErrorMessage().
// Thread-safe.
#pragma once

#include <source_location>
#include <string>

#include "engine/simt/runtime_types.h"

namespace dcf::simt::detail {

// "file:line" of `where`, the path relative to the repository (a .cu file compiled through
// its generated wrapper is named by its own path).
std::string SourceSite(const std::source_location& where);

// The sticky error, or cudaSuccess. Runtime calls start with
//   if (cudaError_t e = StickyError(); e != cudaSuccess) return e;
cudaError_t StickyError();

// Records a failed call: sets the calling thread's last error and the last message (printed
// to stderr when `print`), and returns `error` for the caller to return.
cudaError_t Fail(cudaError_t error, std::string message, bool print = false);

// A kernel broke the programming model (partial barrier, bad shared index, ...): prints
// "dcf simt: <message>" to stderr, makes cudaErrorLaunchFailure sticky with this message
// (the first violation's message is kept until ClearErrors) or aborts with DCF_SIMT_ABORT=1.
void ReportViolation(const std::string& message);

}  // namespace dcf::simt::detail
