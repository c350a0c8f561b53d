#include "engine/simt/launch.h"

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/simt/block_runner.h"
#include "engine/simt/config.h"
#include "engine/simt/device_queue.h"
#include "engine/simt/error_state.h"
#include "engine/simt/kernel_attributes.h"
#include "engine/simt/library_work.h"
#include "engine/simt/runtime.h"
#include "engine/simt/schedule.h"
#include "engine/simt/simt_testing.h"
#include "engine/simt/stream_registry.h"
#include "engine/simt/trace.h"
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

// Runs every block of the grid (the queued work of a launch).
void RunGrid(const LaunchRequest& request) {
  const size_t shared_limit =
      HasDynamicSharedOptIn(request.kernel) ? kMaxSharedPerBlockOptin : kDefaultSharedPerBlock;
  const uint64_t num_blocks = uint64_t{request.grid.x} * request.grid.y * request.grid.z;
  const Schedule schedule = CurrentSchedule();
  const uint64_t serial = NextScheduleSerial();
  // The schedule's block order: a permutation of the linear block indices.
  std::vector<uint32_t> order;
  if (schedule.kind == ScheduleKind::kRandom) {
    order.resize(num_blocks);
    for (uint64_t b = 0; b < num_blocks; ++b) order[b] = static_cast<uint32_t>(b);
    ScheduleRng rng(ScheduleSeed(schedule.seed, serial, 0));
    for (uint64_t i = num_blocks; i > 1; --i) std::swap(order[i - 1], order[rng.Below(i)]);
  }
  const auto block_at = [&](uint64_t i) -> uint64_t {
    switch (schedule.kind) {
      case ScheduleKind::kLinear:
        return i;
      case ScheduleKind::kReverse:
        return num_blocks - 1 - i;
      case ScheduleKind::kRandom:
        return order[i];
    }
    return i;
  };

  std::atomic<uint64_t> next_block{0};
  std::atomic<bool> failed{false};
  const std::function<void()> work = [&] {
    BlockRunner& runner = BlockRunner::ForThisThread();
    while (!failed.load(std::memory_order_relaxed)) {
      const uint64_t i = next_block.fetch_add(1, std::memory_order_relaxed);
      if (i >= num_blocks) break;
      const uint64_t b = block_at(i);
      if (!runner.Run(request, shared_limit, BlockIndex(b, request.grid),
                      ScheduleSeed(schedule.seed, serial, b + 1))) {
        failed.store(true, std::memory_order_relaxed);
      }
    }
  };
  const int threads = WorkerThreads();
  WorkerPool::Get().Run(
      static_cast<int>(num_blocks < static_cast<uint64_t>(threads) ? num_blocks : threads), work);
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
  Work w;
  w.kind = Work::Kind::kKernel;
  w.name = request.kernel_name;
  w.function = request.kernel;
  w.grid = request.grid;
  w.block = request.block;
  w.smem = request.dynamic_shared_bytes;
  auto queued = std::make_shared<const LaunchRequest>(request);
  w.run = [queued] { RunGrid(*queued); };
  TraceWork(w, /*async=*/true);
  if (const cudaError_t e = Submit(request.stream, std::move(w)); e != cudaSuccess) {
    Fail(e, std::string("launch of kernel '") + request.kernel_name +
                "': the legacy stream while a blocking stream is being captured");
  }
}

}  // namespace detail

cudaError_t EnqueueGemm(cudaStream_t stream, int m, int n, int k, std::function<void()> work) {
  if (const cudaError_t e = detail::StickyError(); e != cudaSuccess) return e;
  if (!detail::IsLiveStream(stream)) {
    return detail::Fail(cudaErrorInvalidResourceHandle, "GEMM: the stream is not live");
  }
  detail::Work w;
  w.kind = detail::Work::Kind::kGemm;
  w.m = m;
  w.n = n;
  w.k = k;
  w.run = std::move(work);
  detail::TraceWork(w, /*async=*/true);
  if (const cudaError_t e = detail::Submit(stream, std::move(w)); e != cudaSuccess) {
    return detail::Fail(e, "GEMM: the legacy stream while a blocking stream is being captured");
  }
  return cudaSuccess;
}

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
