// Costs of the SIMT emulator (emulator build only): a raw fiber switch for each switch
// implementation, a 256-thread block doing 8 barriers, warp shuffles, and grid throughput
// with one and several worker threads. Prints one line per measurement.
//
//   build/bin/dcformer-simt-bench [--quick]
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "engine/simt/cuda_compat.h"
#include "engine/simt/config.h"
#include "engine/simt/fiber_context.h"
#include "engine/simt/fiber_stacks.h"
#include "engine/simt/simt_testing.h"

namespace {

using dcf::simt::detail::ContextKind;
using dcf::simt::detail::FiberContext;
using dcf::simt::detail::FiberStacks;

// Single-threaded measurements use the calling thread's CPU time, so that other processes on
// a busy machine do not inflate them; worker-pool measurements need wall time.
enum class Timer { kThreadCpu, kWall };

double Now(Timer timer) {
  timespec ts;
  clock_gettime(timer == Timer::kThreadCpu ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Best of `repeats` timings of fn(), in seconds.
double Best(int repeats, Timer timer, const std::function<void()>& fn) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const double start = Now(timer);
    fn();
    best = std::min(best, Now(timer) - start);
  }
  return best;
}

struct PingPong {
  FiberContext main;
  FiberContext fiber;
  long rounds = 0;
};
PingPong* ping_pong = nullptr;

void PingPongFiber(void*) {
  for (;;) FiberContext::Switch(ping_pong->fiber, ping_pong->main);
}

void BenchSwitch(ContextKind kind, const char* name, long rounds) {
  FiberStacks stacks(64 * 1024);
  stacks.Reserve(1);
  PingPong p;
  ping_pong = &p;
  p.fiber.Prepare(kind, stacks.stack(0), stacks.stack_bytes(), &PingPongFiber, nullptr);
  const double s = Best(5, Timer::kThreadCpu, [&] {
    for (long i = 0; i < rounds; ++i) FiberContext::Switch(p.main, p.fiber);
  });
  std::printf("switch %-9s %8.1f ns per switch (%ld round trips)\n", name, s * 1e9 / (2 * rounds),
              rounds);
}

__global__ void EmptyKernel(float* out) {
  if (threadIdx.x == 0) out[blockIdx.x] = 1.0f;
}

__global__ void BarrierKernel(float* out) {
  DCF_SHARED(float, scratch, 256);
  float v = threadIdx.x;
  for (int i = 0; i < 8; ++i) {
    scratch[threadIdx.x] = v;
    __syncthreads();
    v += scratch[(threadIdx.x + 1) % blockDim.x];
  }
  if (threadIdx.x == 0) out[blockIdx.x] = v;
}

__global__ void ShuffleKernel(float* out) {
  float v = threadIdx.x;
  for (int mask = 16; mask > 0; mask /= 2) v += __shfl_xor_sync(0xffffffffu, v, mask);
  if (threadIdx.x == 0) out[blockIdx.x] = v;
}

__global__ void ComputeKernel(float* out, int iterations) {
  float a = threadIdx.x * 1e-3f, b = 1.0f;
  for (int i = 0; i < iterations; ++i) b = a * b + 0.5f;
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = b;
}

template <typename Launch>
double PerBlockMicros(int blocks, Timer timer, Launch launch) {
  const double s = Best(5, timer, [&] {
    launch();
    if (cudaGetLastError() != cudaSuccess) std::printf("launch failed\n");
  });
  return s * 1e6 / blocks;
}

}  // namespace

int main(int argc, char** argv) {
  // It has one flag; anything else is a usage error, as in every dcformer tool.
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::printf(
          "dcformer-simt-bench: costs of the SIMT emulator\n  dcformer-simt-bench [--quick]\n\n"
          "Flags:\n  --quick (default false)\n      fewer rounds and blocks\n");
      return 0;
    } else {
      std::fprintf(stderr,
                   "dcformer-simt-bench: unknown argument '%s' (it takes only --quick)\n",
                   argv[i]);
      return 2;
    }
  }
  const long rounds = quick ? 200000 : 2000000;
  BenchSwitch(ContextKind::kUcontext, "ucontext", rounds / 10);
  if (dcf::simt::detail::AssemblyContextAvailable()) {
    BenchSwitch(ContextKind::kAssembly, "asm", rounds);
  }

  const int blocks = quick ? 100 : 1000;
  float* out = nullptr;
  cudaMalloc(&out, blocks * sizeof(float));
  dcf::simt::SetWorkerThreads(1);
  const double empty = PerBlockMicros(
      blocks, Timer::kThreadCpu, [&] { DCF_LAUNCH(EmptyKernel, blocks, 256, 0, nullptr, out); });
  const double barriers = PerBlockMicros(
      blocks, Timer::kThreadCpu, [&] { DCF_LAUNCH(BarrierKernel, blocks, 256, 0, nullptr, out); });
  const double shuffles = PerBlockMicros(
      blocks, Timer::kThreadCpu, [&] { DCF_LAUNCH(ShuffleKernel, blocks, 256, 0, nullptr, out); });
  std::printf("(CPU time of the calling thread, best of 5)\n");
  std::printf("block of 256 threads, no barrier:      %8.2f us\n", empty);
  std::printf("block of 256 threads, 8 __syncthreads: %8.2f us (%.1f ns per thread-barrier)\n",
              barriers, (barriers - empty) * 1e3 / (256 * 8));
  std::printf("block of 256 threads, 5 __shfl_xor:    %8.2f us (%.1f ns per lane-shuffle)\n",
              shuffles, (shuffles - empty) * 1e3 / (256 * 5));

  // Grid throughput by worker threads (wall time, best of 5): a compute-heavy grid, and a
  // launch of 4 small blocks (where waking helpers costs more than it saves).
  const int iterations = quick ? 200 : 2000;
  for (int threads : {1, 2, 4}) {
    dcf::simt::SetWorkerThreads(threads);
    const double heavy = PerBlockMicros(blocks, Timer::kWall, [&] {
      DCF_LAUNCH(ComputeKernel, blocks, 256, 0, nullptr, out, iterations);
    });
    const double small = PerBlockMicros(4, Timer::kWall,
                                        [&] {
                                          for (int i = 0; i < 100; ++i)
                                            DCF_LAUNCH(EmptyKernel, 4, 64, 0, nullptr, out);
                                        }) /
                         100;
    std::printf(
        "workers %d: %d blocks x 256 threads x %d mul-adds: %8.2f us/block; "
        "4 blocks x 64 threads: %6.2f us/block\n",
        threads, blocks, iterations, heavy, small);
  }
  cudaFree(out);
  return 0;
}
