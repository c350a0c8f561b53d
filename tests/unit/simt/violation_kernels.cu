// Kernels that break the programming model on purpose (see violation_kernels.h).
#include "tests/unit/simt/violation_kernels.h"

namespace dcf::cuda_test {

// Each line constant is written just above its kernel, as an offset from there.
extern const int kPartialBarrierLine = __LINE__ + 8;
extern const int kFirstBarrierLine = __LINE__ + 12;
extern const int kSecondBarrierLine = __LINE__ + 13;

namespace {
__global__ void PartialBarrierKernel(int* out) {
  if (threadIdx.x == 3) return;
  out[threadIdx.x] = 1;
  __syncthreads();  // kPartialBarrierLine
}

__global__ void MismatchedBarriersKernel(int* out) {
  if (threadIdx.x < 16) {
    __syncthreads();  // kFirstBarrierLine
  } else {
    __syncthreads();  // kSecondBarrierLine
  }
  out[threadIdx.x] = 1;
}

__global__ void SharedIndexKernel(int* out, int index) {
  DCF_SHARED(int, tile, 32);
  tile[threadIdx.x] = threadIdx.x;
  __syncthreads();
  out[threadIdx.x] = threadIdx.x == 5 ? tile[index] : tile[threadIdx.x];
}

__global__ void DynamicIndexKernel(int* out) {
  DCF_DYNAMIC_SHARED(float, values);
  values[threadIdx.x] = 1.0f;
  out[threadIdx.x] = 1;
}

__global__ void StaticSharedTooLargeKernel(int* out) {
  DCF_SHARED(float, a, 8192);  // 32 KiB
  DCF_SHARED(float, b, 4352);  // 17 KiB more: 49 KiB in all
  a[threadIdx.x] = 1.0f;
  b[threadIdx.x] = 1.0f;
  out[threadIdx.x] = 1;
}

}  // namespace
extern const int kShuffleLine = __LINE__ + 8;
namespace {

__global__ void WarpKernel(Violation v, int* out) {
  const int lane = threadIdx.x % 32;
  int value = threadIdx.x;
  switch (v) {
    case Violation::kMaskNamesMissingLanes:
      value = __shfl_sync(0xffffffffu, value, 0);  // kShuffleLine
      break;
    case Violation::kLaneExited:
      if (lane == 7) return;
      value = __shfl_xor_sync(0xffffffffu, value, 1);
      break;
    case Violation::kCallerNotInMask:
      if (lane == 3) value = __shfl_sync(0x1u, value, 0);
      break;
    case Violation::kReadOutsideMask:
      if (lane < 16) {
        value = __shfl_down_sync(0x0000ffffu, value, 8);
      } else {
        __syncwarp(0xffff0000u);
      }
      break;
    case Violation::kMismatchedCollectives:
      if (lane < 16) {
        value = __shfl_sync(0xffffffffu, value, 0);
      } else {
        value = static_cast<int>(__ballot_sync(0xffffffffu, value > 20));
      }
      break;
    case Violation::kBarrierWhileWarpWaits:
      if (lane == 0) {
        __syncthreads();
      } else {
        value = __shfl_sync(0xffffffffu, value, 0);
      }
      break;
    case Violation::kBadWidth:
      value = __shfl_xor_sync(0xffffffffu, value, 1, 12);
      break;
    default:
      break;
  }
  out[threadIdx.x] = value;
}

__global__ void RaceKernel(Violation v, int* out) {
  DCF_SHARED(int, s, 64);
  const int t = threadIdx.x;
  int value = 0;
  switch (v) {
    case Violation::kRaceAcrossWarps:
      s[t] = t;
      value = s[(t + 32) % 64];
      break;
    case Violation::kRaceWriteWrite:
      s[0] = t;
      break;
    case Violation::kRaceInWarp:
      s[t] = t;
      value = s[t ^ 1];
      break;
    default:
      break;
  }
  out[t] = value;
}

__global__ void DynamicRaceKernel(int* out) {
  DCF_DYNAMIC_SHARED(int, d);
  const int t = threadIdx.x;
  d[t] = t;
  out[t] = d[(t + 32) % 64];
}

__global__ void RaceFreeKernel(int* out) {
  DCF_SHARED(int, s, 64);
  DCF_SHARED(int, counter, 1);
  const int t = threadIdx.x;
  if (t == 0) counter[0] = 0;
  s[t] = t;
  __syncwarp();
  int value = s[t ^ 1];
  __syncthreads();
  value += s[(t + 32) % 64];
  atomicAdd(&counter[0], 1);
  __syncthreads();
  out[t] = value + counter[0];
}

__global__ void IotaKernel(int* out) { out[threadIdx.x] = threadIdx.x; }

__device__ int Deep(int depth) {
  volatile char frame[512];
  frame[0] = static_cast<char>(depth);
  return depth == 0 ? 0 : Deep(depth - 1) + frame[0];
}

__global__ void StackOverflowKernel(int* out, int depth) { out[threadIdx.x] = Deep(depth); }

}  // namespace

cudaError_t LaunchViolation(Violation v, int* out) {
  switch (v) {
    case Violation::kPartialBarrier:
      DCF_LAUNCH(PartialBarrierKernel, 1, 64, 0, nullptr, out);
      break;
    case Violation::kMismatchedBarriers:
      DCF_LAUNCH(MismatchedBarriersKernel, 1, 64, 0, nullptr, out);
      break;
    case Violation::kSharedIndexTooLarge:
      DCF_LAUNCH(SharedIndexKernel, 1, 32, 0, nullptr, out, 32);
      break;
    case Violation::kSharedIndexNegative:
      DCF_LAUNCH(SharedIndexKernel, 1, 32, 0, nullptr, out, -1);
      break;
    case Violation::kDynamicIndexTooLarge:
      DCF_LAUNCH(DynamicIndexKernel, 1, 96, 64 * sizeof(float), nullptr, out);
      break;
    case Violation::kStaticSharedTooLarge:
      DCF_LAUNCH(StaticSharedTooLargeKernel, 1, 32, 0, nullptr, out);
      break;
    case Violation::kMaskNamesMissingLanes:
      DCF_LAUNCH(WarpKernel, 1, 40, 0, nullptr, v, out);
      break;
    case Violation::kRaceAcrossWarps:
    case Violation::kRaceWriteWrite:
    case Violation::kRaceInWarp:
      DCF_LAUNCH(RaceKernel, 1, 64, 0, nullptr, v, out);
      break;
    case Violation::kRaceDynamic:
      DCF_LAUNCH(DynamicRaceKernel, 1, 64, 64 * sizeof(int), nullptr, out);
      break;
    default:
      DCF_LAUNCH(WarpKernel, 1, 32, 0, nullptr, v, out);
      break;
  }
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  return cudaDeviceSynchronize();  // a fault is reported by the call that waits for the kernel
}

cudaError_t LaunchRaceFree(int* out) {
  DCF_LAUNCH(RaceFreeKernel, 1, 64, 0, nullptr, out);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  return cudaDeviceSynchronize();
}

cudaError_t LaunchStackOverflow(int* out) {
  DCF_LAUNCH(StackOverflowKernel, 1, 2, 0, nullptr, out, 100000);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  return cudaDeviceSynchronize();
}

cudaError_t LaunchIota(int* out, int threads, size_t dynamic_bytes) {
  DCF_LAUNCH(IotaKernel, 1, threads, dynamic_bytes, nullptr, out);
  return cudaGetLastError();
}

}  // namespace dcf::cuda_test
