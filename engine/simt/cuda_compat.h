// The one header every CUDA source of the project includes: kernel sources (.cu) and CUDA
// host sources (.cc under engine/cuda). The same sources build two ways:
//   - real CUDA: nvcc compiles the .cu files (__CUDACC__), g++ compiles the .cc files with
//     DCF_CUDA_REAL against the toolkit's headers; linked to the static CUDA runtime;
//   - emulated: g++ compiles everything (the .cu files through generated wrappers) with
//     DCF_CUDA_SIM against the SIMT emulator in engine/simt, which needs no toolkit and
//     no GPU. This is how CI runs the kernels (docs/CUDA_SIM.md).
// cmake/Cuda.cmake (dcf_add_cuda_library, dcf_add_cuda_test) sets the macros; a source never
// defines them itself.
//
// ============================== The kernel-facing contract ==============================
// Kernels and their host code use only what is listed here; it means the same in both
// builds. Keep .cu files plain C++ plus this header (no absl, no std containers in device
// code), so nvcc never parses more than it must.
//
// Qualifiers: __global__, __device__, __host__, __forceinline__, __restrict__,
//   __launch_bounds__(n) (ignored by the emulator).
// Built-ins: threadIdx, blockIdx (uint3), blockDim, gridDim (dim3), warpSize (32), dim3.
//   Linear thread id = x + y * blockDim.x + z * blockDim.x * blockDim.y; a warp is 32
//   consecutive linear ids.
// Barriers: __syncthreads(), __syncwarp(mask).
// Warp collectives (full CUDA semantics, including the `width` argument):
//   __shfl_sync, __shfl_up_sync, __shfl_down_sync, __shfl_xor_sync on int, unsigned int,
//   long long, unsigned long long, float, double (also long, unsigned long, __half,
//   __nv_bfloat16); __ballot_sync, __any_sync, __all_sync. Every lane named in the mask must
//   reach the same collective with the same mask; the calling lane must be in the mask.
// Shared memory: only through these macros, indexed only as name[i]:
//   DCF_SHARED(T, name, N);     block-shared array of N elements of T (N a constant)
//   DCF_DYNAMIC_SHARED(T, name); the launch's dynamic shared memory as an array of T
//                                (16-byte aligned; size = launch bytes / sizeof(T))
//   Under nvcc these are `__shared__ T name[N]` and an `extern __shared__` array; in the
//   emulator they are bounds-checked views whose operator[] returns T&. Consequently:
//   - never keep a raw pointer into shared memory (no `T* p = name;`, no `name + k`): the
//     only pointer use allowed is `&name[i]` as the operand of an atomic;
//   - to hand a shared array to a __device__ helper, make the helper a template,
//     `template <typename Smem> __device__ void F(Smem& smem)`, or declare the array inside
//     the helper (a DCF_SHARED declaration is one array per block, however often reached);
//   - several dynamic arrays share the one dynamic area: declare one DCF_DYNAMIC_SHARED per
//     element type and offset the index (`DCF_DYNAMIC_SHARED(float, smem); smem[n + i]`).
//   T is a trivial type; a multi-dimensional array is a 1-D array indexed by hand. Declare
//   shared arrays inside kernels and __device__ functions only (not at namespace scope).
// Atomics on global and shared memory (return the old value):
//   atomicAdd (int, unsigned int, unsigned long long, float, double),
//   atomicMax / atomicMin (int, unsigned int), atomicCAS (int, unsigned int,
//   unsigned long long), atomicExch (int, unsigned int, float).
// Math: the C float functions (expf, logf, exp2f, log1pf, sqrtf, tanhf, erff, fmaxf, fminf,
//   fabsf, floorf, ceilf, powf, fmaf, isnan, isinf, INFINITY ...), __expf, __logf, __log2f,
//   __powf, __sinf, __cosf, __fdividef, __fmul_rn, __fadd_rn (never fused into an FMA),
//   __saturatef, rsqrtf, __float_as_int,
//   __float_as_uint, __int_as_float, __uint_as_float, __popc, __popcll, __clz, __clzll,
//   __ffs, __ffsll, min/max (both arguments of one type), __ldg, __threadfence,
//   __threadfence_block. The emulator computes fast intrinsics with the accurate host
//   functions, and the GPU contracts a*b+c into FMAs: compare kernel results with tolerances.
// 16-bit floats: __nv_bfloat16, __half, __float2bfloat16(_rn), __bfloat162float,
//   __float2half(_rn), __half2float, __bfloat16_as_ushort, __ushort_as_bfloat16,
//   __half_as_ushort, __ushort_as_half: bit-exact in both builds (round to nearest even).
//   No implicit conversions or operators (both builds define __CUDA_NO_HALF_CONVERSIONS__
//   etc.): convert explicitly and compute in float.
// fp8 (E4M3 only): __nv_fp8_storage_t (unsigned char), __nv_fp8x2_storage_t, __nv_fp8_e4m3
//   (explicit from float, saturating; explicit to float), __half_raw, __half2_raw,
//   __nv_cvt_float_to_fp8(x, __NV_SATFINITE or __NV_NOSAT, __NV_E4M3),
//   __nv_cvt_fp8_to_halfraw(x, __NV_E4M3), __nv_cvt_fp8x2_to_halfraw2(x, __NV_E4M3):
//   bit-exact in both builds (round to nearest even; engine/simt/fp8_types.h has the rules).
// Vector types: float2, float4, int2, int4, uint2, uint4 (CUDA's alignment), make_*.
// Launch, only in .cu files and only through this macro (no `<<<` anywhere else):
//   DCF_LAUNCH(kernel, grid, block, dynamic_smem_bytes, stream, args...);
//   A template kernel with several arguments goes in parentheses:
//   DCF_LAUNCH((Kernel<float, 4>), grid, block, 0, stream, args...).
//   Check errors afterwards with cudaGetLastError(), as with <<<>>>.
// Runtime API (host code): cudaError_t and codes, cudaGetErrorString, cudaGetErrorName,
//   cudaGetLastError, cudaPeekAtLastError, cudaMalloc, cudaFree, cudaMallocHost,
//   cudaFreeHost, cudaMemcpy(Async) with cudaMemcpyKind, cudaMemset(Async), cudaStream_t
//   with cudaStreamCreate(WithFlags)/Destroy/Synchronize/Query/WaitEvent, cudaEvent_t with
//   cudaEventCreate(WithFlags)/Record/Synchronize/Query/ElapsedTime/Destroy,
//   cudaDeviceSynchronize, cudaGetDeviceCount, cudaSetDevice, cudaGetDevice,
//   cudaGetDeviceProperties (cudaDeviceProp: name, totalGlobalMem, sharedMemPerBlock,
//   sharedMemPerBlockOptin, multiProcessorCount, major, minor, warpSize,
//   maxThreadsPerBlock, maxThreadsDim, maxGridSize ...), cudaMemGetInfo,
//   cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
//   graphs: cudaStreamBeginCapture/EndCapture/IsCapturing (cudaStreamCaptureMode...,
//   cudaStreamCaptureStatus...), cudaGraph_t, cudaGraphExec_t, cudaGraphNode_t,
//   cudaGraphInstantiate(exec, graph, 0), cudaGraphLaunch, cudaGraphExecUpdate
//   (cudaGraphExecUpdateResultInfo), cudaGraphGetNodes, cudaGraphDestroy, cudaGraphExecDestroy.
//   Work is asynchronous in both builds: results are visible to the host only after a
//   synchronising call, kernel faults are reported by the call that waits.
// Trace hook (host code): DCF_TRACE_STEP(tokens, seqs) marks the start of a backend step in
//   the emulator's trace (engine/simt/trace.h); it compiles to nothing in a real build.
//
// Symbols: code in engine/cuda goes inside `namespace dcf::cuda { inline namespace
// DCF_CUDA_NS { ... } }` (kernels may also sit in an anonymous namespace). DCF_CUDA_NS is
// `sim` or `gpu`, so one binary can link both builds of a library without clashes.
//
// What the emulator checks, and how it reports, is in engine/simt/block_runner.h and
// launch.h: partial or mismatched barriers, bad warp masks, shared-memory bounds, launch
// configuration. A kernel violation makes cudaErrorLaunchFailure sticky (the next runtime
// call and cudaGetLastError report it) and prints the kernel, block, thread, call site and
// offending value to stderr; DCF_SIMT_ABORT=1 aborts instead. Emulator-only test hooks are
// in engine/simt/simt_testing.h (include it only under #ifdef DCF_CUDA_SIM).
#pragma once

#if defined(DCF_CUDA_SIM) && (defined(DCF_CUDA_REAL) || defined(__CUDACC__))
#error "DCF_CUDA_SIM and a real CUDA build (DCF_CUDA_REAL / nvcc) are mutually exclusive"
#endif

#if defined(__CUDACC__) || defined(DCF_CUDA_REAL)
// ----------------------------------- Real CUDA ------------------------------------------
#ifndef __CUDA_NO_HALF_CONVERSIONS__
#define __CUDA_NO_HALF_CONVERSIONS__
#endif
#ifndef __CUDA_NO_HALF_OPERATORS__
#define __CUDA_NO_HALF_OPERATORS__
#endif
#ifndef __CUDA_NO_HALF2_OPERATORS__
#define __CUDA_NO_HALF2_OPERATORS__
#endif
#ifndef __CUDA_NO_BFLOAT16_CONVERSIONS__
#define __CUDA_NO_BFLOAT16_CONVERSIONS__
#endif
#ifndef __CUDA_NO_BFLOAT16_OPERATORS__
#define __CUDA_NO_BFLOAT16_OPERATORS__
#endif
#ifndef __CUDA_NO_BFLOAT162_OPERATORS__
#define __CUDA_NO_BFLOAT162_OPERATORS__
#endif
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#define DCF_CUDA_NS gpu

#define DCF_SHARED(T, name, N) __shared__ T name[N]
#define DCF_DYNAMIC_SHARED(T, name)                                         \
  extern __shared__ __align__(16) unsigned char dcf_dynamic_shared_bytes[]; \
  T* const name = reinterpret_cast<T*>(dcf_dynamic_shared_bytes)
#define DCF_LAUNCH(kernel, grid, block, smem_bytes, stream, ...) \
  kernel<<<grid, block, smem_bytes, stream>>>(__VA_ARGS__)
#define DCF_TRACE_STEP(tokens, seqs) ((void)(tokens), (void)(seqs))

#elif defined(DCF_CUDA_SIM)
// ------------------------------------ Emulator ------------------------------------------
#include "engine/simt/simt.h"

#define DCF_CUDA_NS sim

// The key of a static shared array is the address of a function-local static: one per
// declaration (and per template instantiation), like a __shared__ variable.
#define DCF_SHARED(T, name, N)                                                                   \
  static char dcf_shared_key_##name;                                                             \
  const ::dcf::simt::SharedArray<T, (N)> name(                                                   \
      static_cast<T*>(::dcf::simt::detail::StaticShared(&dcf_shared_key_##name, sizeof(T) * (N), \
                                                        alignof(T), #name)),                     \
      #name)
#define DCF_DYNAMIC_SHARED(T, name) \
  const ::dcf::simt::DynamicSharedArray<T> name(::dcf::simt::detail::DynamicShared(), #name)
#define DCF_LAUNCH(kernel, grid, block, smem_bytes, stream, ...) \
  ::dcf::simt::Launch(#kernel, kernel, grid, block, smem_bytes, stream __VA_OPT__(, ) __VA_ARGS__)
#define DCF_TRACE_STEP(tokens, seqs) ::dcf::simt::TraceStep(tokens, seqs)

#else
// dcf_add_cuda_library / dcf_add_cuda_test (cmake/Cuda.cmake) define one of them.
#error "define DCF_CUDA_SIM or DCF_CUDA_REAL (or compile with nvcc)"
#endif
