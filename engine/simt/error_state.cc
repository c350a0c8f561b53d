#include "engine/simt/error_state.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "engine/simt/config.h"
#include "engine/simt/runtime.h"
#include "engine/simt/simt_testing.h"

namespace dcf::simt {
namespace detail {
namespace {

struct ErrorState {
  std::atomic<cudaError_t> sticky{cudaSuccess};
  std::mutex mu;
  std::string message;  // guarded by mu
};

ErrorState& State() {
  static auto* state = new ErrorState();  // never destroyed: usable during exit
  return *state;
}

thread_local cudaError_t last_error = cudaSuccess;

void SetMessage(std::string message) {
  std::lock_guard<std::mutex> lock(State().mu);
  State().message = std::move(message);
}

}  // namespace

// "file:line" with the path normalised: a .cu file compiled through its generated wrapper
// is named "<wrapper dir>/../../<path>"; "dir/.." pairs and leading "../" are dropped, and so
// is the source root, so that messages name files as the repository does.
std::string SourceSite(const std::source_location& where) {
  std::vector<std::string> parts;
  const std::string path = where.file_name();
  const bool absolute = !path.empty() && path[0] == '/';
  size_t begin = 0;
  while (begin <= path.size()) {
    size_t end = path.find('/', begin);
    if (end == std::string::npos) end = path.size();
    const std::string part = path.substr(begin, end - begin);
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    begin = end + 1;
  }
  std::string normalised = absolute ? "/" : "";
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) normalised += '/';
    normalised += parts[i];
  }
#ifdef DCF_SIMT_SOURCE_ROOT
  const std::string root = DCF_SIMT_SOURCE_ROOT;
  if (normalised.compare(0, root.size(), root) == 0) normalised.erase(0, root.size());
#endif
  return normalised + ":" + std::to_string(where.line());
}

cudaError_t StickyError() { return State().sticky.load(std::memory_order_acquire); }

cudaError_t Fail(cudaError_t error, std::string message, bool print) {
  last_error = error;
  if (print) std::fprintf(stderr, "dcf simt: %s\n", message.c_str());
  SetMessage(std::move(message));
  return error;
}

void ReportViolation(const std::string& message) {
  std::fprintf(stderr, "dcf simt: %s\n", message.c_str());
  if (AbortOnViolation()) {
    std::fprintf(stderr, "dcf simt: aborting (DCF_SIMT_ABORT=1)\n");
    std::abort();
  }
  ErrorState& state = State();
  std::lock_guard<std::mutex> lock(state.mu);
  if (state.sticky.load(std::memory_order_relaxed) == cudaSuccess) {
    state.message = message;
    state.sticky.store(cudaErrorLaunchFailure, std::memory_order_release);
  }
}

}  // namespace detail

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
#define DCF_SIMT_ERROR_NAME(e) \
  case e:                      \
    return #e;
    DCF_SIMT_ERROR_NAME(cudaSuccess)
    DCF_SIMT_ERROR_NAME(cudaErrorInvalidValue)
    DCF_SIMT_ERROR_NAME(cudaErrorMemoryAllocation)
    DCF_SIMT_ERROR_NAME(cudaErrorInitializationError)
    DCF_SIMT_ERROR_NAME(cudaErrorInvalidConfiguration)
    DCF_SIMT_ERROR_NAME(cudaErrorInvalidDevicePointer)
    DCF_SIMT_ERROR_NAME(cudaErrorInvalidMemcpyDirection)
    DCF_SIMT_ERROR_NAME(cudaErrorInsufficientDriver)
    DCF_SIMT_ERROR_NAME(cudaErrorInvalidDeviceFunction)
    DCF_SIMT_ERROR_NAME(cudaErrorNoDevice)
    DCF_SIMT_ERROR_NAME(cudaErrorInvalidDevice)
    DCF_SIMT_ERROR_NAME(cudaErrorInvalidResourceHandle)
    DCF_SIMT_ERROR_NAME(cudaErrorIllegalState)
    DCF_SIMT_ERROR_NAME(cudaErrorNotReady)
    DCF_SIMT_ERROR_NAME(cudaErrorIllegalAddress)
    DCF_SIMT_ERROR_NAME(cudaErrorLaunchOutOfResources)
    DCF_SIMT_ERROR_NAME(cudaErrorAssert)
    DCF_SIMT_ERROR_NAME(cudaErrorLaunchFailure)
    DCF_SIMT_ERROR_NAME(cudaErrorNotSupported)
    DCF_SIMT_ERROR_NAME(cudaErrorStreamCaptureUnsupported)
    DCF_SIMT_ERROR_NAME(cudaErrorStreamCaptureInvalidated)
    DCF_SIMT_ERROR_NAME(cudaErrorStreamCaptureUnmatched)
    DCF_SIMT_ERROR_NAME(cudaErrorStreamCaptureUnjoined)
    DCF_SIMT_ERROR_NAME(cudaErrorStreamCaptureIsolation)
    DCF_SIMT_ERROR_NAME(cudaErrorStreamCaptureImplicit)
    DCF_SIMT_ERROR_NAME(cudaErrorCapturedEvent)
    DCF_SIMT_ERROR_NAME(cudaErrorStreamCaptureWrongThread)
    DCF_SIMT_ERROR_NAME(cudaErrorGraphExecUpdateFailure)
    DCF_SIMT_ERROR_NAME(cudaErrorUnknown)
#undef DCF_SIMT_ERROR_NAME
  }
  return "cudaErrorUnknown";
}

// The CUDA runtime's own wording, so logs read the same in both builds.
const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInitializationError:
      return "initialization error";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer:
      return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection:
      return "invalid memcpy direction";
    case cudaErrorInsufficientDriver:
      return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorInvalidDeviceFunction:
      return "invalid device function";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorIllegalState:
      return "the operation cannot be performed in the present state";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources:
      return "too many resources requested for launch";
    case cudaErrorAssert:
      return "device-side assert triggered";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorNotSupported:
      return "operation not supported";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated:
      return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnmatched:
      return "capture was not initiated in this stream";
    case cudaErrorStreamCaptureUnjoined:
      return "capturing stream has unjoined work";
    case cudaErrorStreamCaptureIsolation:
      return "dependency created on uncaptured work in another stream";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent:
      return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorStreamCaptureWrongThread:
      return "attempt to terminate a thread-local capture sequence from another thread";
    case cudaErrorGraphExecUpdateFailure:
      return "the graph update was not performed because it included changes which violated "
             "constraints specific to instantiated graph update";
    case cudaErrorUnknown:
      return "unknown error";
  }
  return "unrecognized error code";
}

cudaError_t cudaGetLastError() {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  const cudaError_t e = detail::last_error;
  detail::last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() {
  if (cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  return detail::last_error;
}

void InjectStickyError(cudaError_t error, std::string_view message) {
  detail::ErrorState& state = detail::State();
  std::lock_guard<std::mutex> lock(state.mu);
  state.message = std::string(message);
  state.sticky.store(error, std::memory_order_release);
}

void ClearErrors() {
  detail::ErrorState& state = detail::State();
  std::lock_guard<std::mutex> lock(state.mu);
  state.message.clear();
  state.sticky.store(cudaSuccess, std::memory_order_release);
  detail::last_error = cudaSuccess;
}

std::string LastErrorMessage() {
  detail::ErrorState& state = detail::State();
  std::lock_guard<std::mutex> lock(state.mu);
  return state.message;
}

}  // namespace dcf::simt
