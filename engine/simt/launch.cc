#include "engine/simt/launch.h"

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>

#include "engine/simt/block_runner.h"
#include "engine/simt/config.h"
#include "engine/simt/error_state.h"
#include "engine/simt/kernel_attributes.h"
#include "engine/simt/runtime.h"
#include "engine/simt/simt_testing.h"
#include "engine/simt/stream_registry.h"
#include "engine/simt/worker_pool.h"

namespace dcf::simt {
namespace detail {
namespace {

std::atomic<int> worker_threads{0};  // 0: not yet read from the config

std::string Dims(dim3 d) {
  char text[48];
  std::snprintf(text, sizeof(text), "(%u,%u,%u)", d.x, d.y, d.z);
  return text;
}

// The CUDA runtime's launch checks; cudaSuccess when the launch may run.
cudaError_t CheckConfiguration(const LaunchRequest& r, std::string* why) {
  const dim3 g = r.grid;
  const dim3 b = r.block;
  const uint64_t threads = uint64_t{b.x} * b.y * b.z;
  if (g.x == 0 || g.y == 0 || g.z == 0 || threads == 0) {
    *why = "grid " + Dims(g) + " or block " + Dims(b) + " is empty";
    return cudaErrorInvalidConfiguration;
  }
  if (threads > kMaxThreadsPerBlock || b.x > 1024 || b.y > 1024 || b.z > 64) {
    *why = "block " + Dims(b) + " has " + std::to_string(threads) +
           " threads; the limit is 1024 (and 1024 x 1024 x 64 per dimension)";
    return cudaErrorInvalidConfiguration;
  }
  if (g.x > 0x7fffffffu || g.y > 65535 || g.z > 65535) {
    *why = "grid " + Dims(g) + " exceeds (2^31-1, 65535, 65535)";
    return cudaErrorInvalidConfiguration;
  }
  const size_t limit = MaxDynamicSharedBytes(r.kernel);
  if (r.dynamic_shared_bytes > limit) {
    *why = std::to_string(r.dynamic_shared_bytes) + " bytes of dynamic shared memory exceed the " +
           "kernel's limit of " + std::to_string(limit) +
           " bytes (raise it with cudaFuncSetAttribute(kernel, "
           "cudaFuncAttributeMaxDynamicSharedMemorySize, bytes))";
    return cudaErrorInvalidValue;
  }
  if (!IsLiveStream(r.stream)) {
    *why = "the stream is not a live stream handle";
    return cudaErrorInvalidResourceHandle;
  }
  return cudaSuccess;
}

uint3 BlockIndex(uint64_t linear, dim3 grid) {
  return uint3{static_cast<unsigned int>(linear % grid.x),
               static_cast<unsigned int>(linear / grid.x % grid.y),
               static_cast<unsigned int>(linear / (uint64_t{grid.x} * grid.y))};
}

}  // namespace

void RunLaunch(const LaunchRequest& request) {
  if (StickyError() != cudaSuccess) return;
  if (BlockRunner::Active() != nullptr) {
    ReportViolation(std::string("kernel '") + request.kernel_name +
                    "' launched from inside a kernel: dynamic parallelism is not supported");
    return;
  }
  std::string why;
  if (const cudaError_t e = CheckConfiguration(request, &why); e != cudaSuccess) {
    Fail(e, std::string("launch of kernel '") + request.kernel_name + "': " + why,
         /*print=*/true);
    return;
  }
  const size_t shared_limit =
      HasDynamicSharedOptIn(request.kernel) ? kMaxSharedPerBlockOptin : kDefaultSharedPerBlock;
  const uint64_t num_blocks = uint64_t{request.grid.x} * request.grid.y * request.grid.z;

  std::atomic<uint64_t> next_block{0};
  std::atomic<bool> failed{false};
  const std::function<void()> work = [&] {
    BlockRunner& runner = BlockRunner::ForThisThread();
    while (!failed.load(std::memory_order_relaxed)) {
      const uint64_t b = next_block.fetch_add(1, std::memory_order_relaxed);
      if (b >= num_blocks) break;
      if (!runner.Run(request, shared_limit, BlockIndex(b, request.grid))) {
        failed.store(true, std::memory_order_relaxed);
      }
    }
  };
  const int threads = WorkerThreads();
  WorkerPool::Get().Run(
      static_cast<int>(num_blocks < static_cast<uint64_t>(threads) ? num_blocks : threads), work);
}

}  // namespace detail

void SetWorkerThreads(int threads) { detail::worker_threads.store(threads < 1 ? 1 : threads); }

int WorkerThreads() {
  int n = detail::worker_threads.load();
  if (n == 0) {
    n = detail::GetConfig().worker_threads;
    detail::worker_threads.store(n);
  }
  return n;
}

}  // namespace dcf::simt
