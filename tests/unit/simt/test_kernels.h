// Host launchers of the contract-test kernels (*_kernels.cu). Each returns the launch's
// cudaGetLastError(). Built twice: against the SIMT emulator and with nvcc.
#pragma once

#include <cstdint>

#include "engine/simt/cuda_compat.h"

namespace dcf::cuda_test {
inline namespace DCF_CUDA_NS {

// out[b] = sum of in[b * chunk .. (b + 1) * chunk) for b in [0, blocks): a block reduction
// with warp shuffles and a shared array of warp partial sums. threads % 32 == 0.
cudaError_t LaunchBlockSum(const float* in, float* out, int chunk, int blocks, int threads,
                           cudaStream_t stream);

// Histogram of values (each in [0, bins), bins <= 64) accumulated in shared memory with
// atomics, then added to hist (global atomics). Also: *total += n (unsigned long long),
// *max_value / *min_value (int atomicMax / atomicMin), *umax (unsigned atomicMax of the values)
// and *fsum += 1.0f per value (float atomicAdd).
struct HistogramOut {
  int* hist;                  // [bins] int, zeroed by the caller
  unsigned long long* total;  // [1]
  int* max_value;             // [1], INT_MIN initially
  int* min_value;             // [1], INT_MAX initially
  unsigned int* umax;         // [1], 0 initially
  float* fsum;                // [1], 0 initially
};
cudaError_t LaunchHistogram(const int* values, int n, int bins, HistogramOut out, int blocks,
                            int threads, cudaStream_t stream);

// Every thread of the grid increments *counter once through an atomicCAS loop, and swaps its
// global id into *slot with atomicExch, writing the previous value to olds[id].
cudaError_t LaunchCasExch(int* counter, unsigned int* slot, unsigned int* olds, int blocks,
                          int threads, cudaStream_t stream);

// One warp collective per thread of a single block of `threads` threads. Each warp uses the
// mask of its existing lanes. For shuffles: out[t] = op(values[t]) with `arg` (source lane,
// delta or lane mask) and `width`; for votes, predicate = values[t] != 0 and out[t] is the
// result. T is int, unsigned int, long long, unsigned long long, float or double.
enum class WarpOpKind { kIdx, kUp, kDown, kXor, kBallot, kAny, kAll, kSyncWarp };
template <typename T>
cudaError_t LaunchWarpOp(WarpOpKind op, const T* values, T* out, int arg, int width, int threads,
                         cudaStream_t stream);

// Block b reverses in[b * blockDim .. ) into out through dynamic shared memory viewed both
// as floats (the values) and as ints (their source indices, at offset blockDim): out[i]
// gets the reversed value and src[i] the index it came from. `dynamic_bytes` >=
// threads * 8; set `opt_in` to raise the kernel's limit to dynamic_bytes first.
cudaError_t LaunchReverseDynamic(const float* in, float* out, int* src, int blocks, int threads,
                                 size_t dynamic_bytes, bool opt_in, cudaStream_t stream);

// Every thread writes its built-ins at its global linear index
// ((block linear) * threads per block + thread linear): 12 ints per thread:
// threadIdx.xyz, blockIdx.xyz, blockDim.xyz, gridDim.xyz.
cudaError_t LaunchWriteIndices(int* out, dim3 grid, dim3 block, cudaStream_t stream);

// Conversions on the device: bf16[i] / half[i] = bits of __float2bfloat16 / __float2half
// of in[i], for i in [0, n).
cudaError_t LaunchFloatToHalfs(const float* in, unsigned short* bf16, unsigned short* half, int n,
                               cudaStream_t stream);
// from_bf16[i] = __bfloat162float(bits i), from_half[i] = __half2float(bits i), i < 65536.
cudaError_t LaunchHalfsToFloat(float* from_bf16, float* from_half, cudaStream_t stream);

// fp8 E4M3 on the device: sat[i] / nosat[i] = __nv_cvt_float_to_fp8(in[i], __NV_SATFINITE /
// __NV_NOSAT, __NV_E4M3), ctor[i] = __nv_fp8_e4m3(in[i]).__x, for i in [0, n).
cudaError_t LaunchFloatToFp8(const float* in, unsigned char* sat, unsigned char* nosat,
                             unsigned char* ctor, int n, cudaStream_t stream);
// For every code c < 256: half[c] = __nv_cvt_fp8_to_halfraw(c).x; pair[2c], pair[2c + 1] =
// __nv_cvt_fp8x2_to_halfraw2(c | (255 - c) << 8) .x, .y; value[c] = float(__nv_fp8_e4m3 c).
cudaError_t LaunchFp8ToHalf(unsigned short* half, unsigned short* pair, float* value,
                            cudaStream_t stream);

// The contract's math on the device: for each x = in[i], out[i * kMathFunctions + f] is
// function f of x (see math_kernels.cu for the order). Inputs must lie in every function's
// domain (0 < x).
inline constexpr int kMathFunctions = 21;
cudaError_t LaunchMath(const float* in, float* out, int n, cudaStream_t stream);

// Vector types: out[i] = in[i] as float4, read through __ldg, plus make_* round trips:
// out[i].x += make_int2(1, 2).y, out[i].y += make_uint4(...).w, out[i].z += make_float2().x,
// out[i].w += make_int4(...).z + make_uint2(...).x. n float4 elements.
cudaError_t LaunchVectorTypes(const float4* in, float4* out, int n, cudaStream_t stream);

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda_test
