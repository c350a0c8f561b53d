// Kernel launches in the SIMT emulator: what DCF_LAUNCH (cuda_compat.h) expands to.
//
// Launch() converts the arguments to the kernel's parameter types once (as a CUDA launch
// copies them), checks the configuration the way the CUDA runtime does, then queues the grid
// on its stream (device_queue.h; or records it in the stream's capture). The grid runs when
// the host waits for it. Configuration errors are reported at the launch: they set the
// calling thread's last error, print one line to stderr and queue nothing:
//   - an empty grid or block, more than 1024 threads per block, block.z > 64, grid.y or
//     grid.z > 65535: cudaErrorInvalidConfiguration;
//   - dynamic shared memory above the kernel's limit (48 KiB unless raised with
//     cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, n)):
//     cudaErrorInvalidValue;
//   - a stream handle that is not live: cudaErrorInvalidResourceHandle.
// With a sticky error pending the launch runs nothing (cudaGetLastError reports the error).
//
// When the grid runs, its blocks run one after the other in the schedule's order (linear: x
// fastest; schedule.h) on the thread that waits, or on a pool of worker threads when
// DCF_SIMT_THREADS > 1 (or SetWorkerThreads). A block's threads run as fibers on one OS
// thread (block_runner.h).
#pragma once

#include <cstddef>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "engine/simt/runtime_types.h"
#include "engine/simt/vector_types.h"

namespace dcf::simt {
namespace detail {

// One launch, with the kernel type-erased: `body(args)` runs the kernel for the thread
// whose built-ins are current.
struct LaunchRequest {
  const char* kernel_name;  // as written at the DCF_LAUNCH call
  const void* kernel;       // the kernel's address: the key of its attributes
  void (*body)(const void* args);
  const void* args;
  std::shared_ptr<const void> keep;  // owns `args` while the launch is queued or in a graph
  dim3 grid;
  dim3 block;
  size_t dynamic_shared_bytes;
  cudaStream_t stream;
};

void RunLaunch(const LaunchRequest& request);

template <typename... Params>
struct KernelCall {
  void (*kernel)(Params...);
  std::tuple<std::decay_t<Params>...> args;
  // Each thread gets its own copies of the parameters, as on a GPU.
  static void Run(const void* self) {
    const auto* call = static_cast<const KernelCall*>(self);
    std::apply(call->kernel, call->args);
  }
};

}  // namespace detail

template <typename... Params, typename... Args>
void Launch(const char* kernel_name, void (*kernel)(Params...), dim3 grid, dim3 block,
            size_t dynamic_shared_bytes, cudaStream_t stream, Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args),
                "DCF_LAUNCH: wrong number of kernel arguments");
  using Call = detail::KernelCall<Params...>;
  // Implicit conversions only, as for a call: a by-value lambda parameter list does it.
  auto pack = [](std::decay_t<Params>... converted) {
    return std::tuple<std::decay_t<Params>...>(std::move(converted)...);
  };
  auto call = std::make_shared<const Call>(Call{kernel, pack(std::forward<Args>(args)...)});
  const void* raw = call.get();
  detail::RunLaunch(detail::LaunchRequest{kernel_name, reinterpret_cast<const void*>(kernel),
                                          &Call::Run, raw, std::move(call), grid, block,
                                          dynamic_shared_bytes, stream});
}

}  // namespace dcf::simt
