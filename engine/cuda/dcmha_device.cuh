// Device helpers of the DCMHA kernels: cache-row addressing, element conversion, vector
// loads, and compose on one warp. Included by dcmha_*.cu only.
#pragma once

#include <cstdint>

#include "engine/simt/cuda_compat.h"
#include "engine/cuda/dcmha_plan.h"
#include "engine/cuda/device_util.cuh"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace dcmha {

// Element conversion and the full warp mask: the helpers every kernel shares.
using dev::FromFloat;
using dev::kFullMask;
using dev::ToFloat;

// Stores x into element i of a buffer of runtime type `type`.
__device__ __forceinline__ void StoreAs(ElemType type, void* base, int64_t i, float x) {
  switch (type) {
    case ElemType::kF32:
      static_cast<float*>(base)[i] = x;
      break;
    case ElemType::kBF16:
      static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(x);
      break;
    case ElemType::kF16:
      static_cast<__half*>(base)[i] = __float2half_rn(x);
      break;
  }
}

// Vector loads (device_util.cuh).
using dev::LoadVec;
using dev::Unpack2;

// VEC floats of a fresh (f32) input; 16-byte loads when `aligned`.
template <int VEC>
__device__ __forceinline__ void LoadFresh(const float* __restrict__ src, bool aligned,
                                          float (&v)[VEC]) {
  if constexpr (VEC % 4 == 0) {
    if (aligned) {
      DCF_UNROLL
      for (int e = 0; e < VEC; e += 4) {
        const float4 x = *reinterpret_cast<const float4*>(src + e);
        v[e] = x.x;
        v[e + 1] = x.y;
        v[e + 2] = x.z;
        v[e + 3] = x.w;
      }
      return;
    }
  }
  DCF_UNROLL
  for (int e = 0; e < VEC; ++e) v[e] = src[e];
}

// ---------------------------------------------------------------------------------------
// Where a key row lives. Position `pos` of a sequence whose new tokens start at `start`
// (step token `tok0`): below `start` in the cache, from `start` on in the fresh inputs.
template <typename CT>
struct KeyRow {
  const CT* cache_row;  // nullptr when fresh (or when the block table has no block)
  int64_t fresh_token;  // step token index, or -1
};

template <typename CT>
__device__ __forceinline__ KeyRow<CT> FindKeyRow(const Params& p, int seq, int start, int tok0,
                                                 int pos) {
  KeyRow<CT> r{nullptr, -1};
  if (pos >= start) {
    r.fresh_token = tok0 + (pos - start);
    return r;
  }
  const int blk = p.block_table[static_cast<int64_t>(seq) * p.blocks_per_seq + pos / p.block_size];
  if (blk >= 0 && blk < p.num_blocks) {
    r.cache_row = static_cast<const CT*>(p.cache) + blk * p.block_elems + p.layer_offset +
                  static_cast<int64_t>(pos % p.block_size) * p.row_elems;
  }
  return r;
}

// Elements [e, e + VEC) of a key's K (part 0) or V (part 1), zero where the row is missing.
template <typename CT, int VEC>
__device__ __forceinline__ void LoadKv(const Params& p, const KeyRow<CT>& r, int part, int e,
                                       float (&v)[VEC]) {
  const int nhd = p.n_head * p.head_dim;
  if (r.fresh_token >= 0) {
    LoadFresh<VEC>(p.qkv + r.fresh_token * p.qkv_stride + (1 + part) * nhd + e, p.fresh_vec_ok, v);
  } else if (r.cache_row != nullptr) {
    LoadVec<CT, VEC>(r.cache_row + part * nhd + e, v);
  } else {
    DCF_UNROLL
    for (int i = 0; i < VEC; ++i) v[i] = 0.0f;
  }
}

// Key-side compose terms of branch `kb` (0: pre-key = model branch 1, 1: post-key = branch 3)
// of one key, as a view: W1 [I][N] at w1(i, m), W2 [I][N] at w2(i, m), G [N] at g(m); zero
// where the row is missing. Loaded on use, so compose holds no term arrays in registers.
template <typename CT>
struct KeyTerms {
  const float* fresh_w;  // dyn row of branch 2 kb + 1: W1 | W2
  const float* fresh_g;  // gates of that branch
  const CT* cached;      // cache row's branch: W1 | W2 | G
  int n;

  __device__ __forceinline__ KeyTerms(const Params& p, const KeyRow<CT>& r, int kb)
      : fresh_w(nullptr), fresh_g(nullptr), cached(nullptr), n(p.n_head) {
    if (r.fresh_token >= 0) {
      const int c = 2 * kb + 1;
      fresh_w = p.dyn + r.fresh_token * p.dyn_stride + c * 2 * kRank * n;
      fresh_g = p.gates + r.fresh_token * p.gates_stride + c * n;
    } else if (r.cache_row != nullptr) {
      cached = r.cache_row + 2 * n * p.head_dim + kb * (2 * kRank + 1) * n;
    }
  }
  __device__ __forceinline__ float At(int i) const {  // i in [0, 5N): W1 | W2 | G
    if (fresh_w != nullptr) return i < 2 * kRank * n ? fresh_w[i] : fresh_g[i - 2 * kRank * n];
    return cached != nullptr ? ToFloat(cached[i]) : 0.0f;
  }
  __device__ __forceinline__ float w1(int i, int m) const { return At(i * n + m); }
  __device__ __forceinline__ float w2(int i, int m) const { return At((kRank + i) * n + m); }
  __device__ __forceinline__ float g(int m) const { return At(2 * kRank * n + m); }
};

// Merges softmax statistics (max m, sum of exp(x - m)) of two sets of scores into (m, s).
__device__ __forceinline__ void MergeStats(float& m, float& s, float other_m, float other_s) {
  if (other_m == -INFINITY) return;
  if (m == -INFINITY) {
    m = other_m;
    s = other_s;
    return;
  }
  const float mx = fmaxf(m, other_m);
  s = s * expf(m - mx) + other_s * expf(other_m - mx);
  m = mx;
}

// A warp serves 32 / LanesPerPair(N) (query, key) pairs at once in compose: N <= 32 heads
// take the next power of two of lanes (a lane per head), more heads take the whole warp
// (several heads per lane, m = sub_lane + 32 j).
__host__ __device__ inline int LanesPerPair(int n_head) {
  int l = 1;
  while (l < n_head && l < 32) l *= 2;
  return l;
}

// Sum over the `width` lanes (a power of two) of this lane's aligned group.
__device__ __forceinline__ float GroupSum(float v, int width) {
  for (int mask = width / 2; mask > 0; mask /= 2) v += __shfl_xor_sync(kFullMask, v, mask);
  return v;
}

// Compose (DCFORMER.md section 4) of the head vector s at one (query, key), in place:
//   s[m] <- s[m] (1 + Gq[m] + Gk[m]) + sum_i W2q[i][m] <W1q[i], s> + W2k[i][m] <W1k[i], s>
// over the `width` = LanesPerPair(N) lanes of this lane's group; this lane holds the heads
// m = sub + width j. The query-side terms are in shared memory at smem[qoff]:
// W1 [I][N] | W2 [I][N] | G [N]. Every lane of the warp calls it (the dot products are
// shuffle reductions), also lanes whose group has no pair (s = 0, terms zero).
template <typename CT, typename Smem>
__device__ __forceinline__ void ComposeGroup(int N, int sub, int width, Smem& smem, int qoff,
                                             const KeyTerms<CT>& k, float (&s)[kMaxHeadsPerLane]) {
  float qa[kRank], ka[kRank];
  DCF_UNROLL
  for (int i = 0; i < kRank; ++i) {
    qa[i] = 0.0f;
    ka[i] = 0.0f;
  }
  DCF_UNROLL
  for (int j = 0; j < kMaxHeadsPerLane; ++j) {
    const int m = sub + width * j;
    if (m >= N) break;
    DCF_UNROLL
    for (int i = 0; i < kRank; ++i) {
      qa[i] += smem[qoff + i * N + m] * s[j];
      ka[i] += k.w1(i, m) * s[j];
    }
  }
  DCF_UNROLL
  for (int i = 0; i < kRank; ++i) {
    qa[i] = GroupSum(qa[i], width);
    ka[i] = GroupSum(ka[i], width);
  }
  DCF_UNROLL
  for (int j = 0; j < kMaxHeadsPerLane; ++j) {
    const int m = sub + width * j;
    if (m >= N) break;
    float v = s[j] * (1.0f + smem[qoff + 2 * kRank * N + m] + k.g(m));
    DCF_UNROLL
    for (int i = 0; i < kRank; ++i) {
      v += smem[qoff + (kRank + i) * N + m] * qa[i] + k.w2(i, m) * ka[i];
    }
    s[j] = v;
  }
}

// The query-side terms of model branch c (0: pre, 2: post) of step token t into
// smem[off, off + 5N): W1 [I][N] | W2 [I][N] | G [N]. Threads of the block share the copy.
template <typename Smem>
__device__ __forceinline__ void LoadQueryTerms(const Params& p, int64_t t, int c, Smem& smem,
                                               int off) {
  const int N = p.n_head;
  const float* dyn = p.dyn + t * p.dyn_stride + c * 2 * kRank * N;
  const float* gate = p.gates + t * p.gates_stride + c * N;
  for (int i = threadIdx.x; i < (2 * kRank + 1) * N; i += blockDim.x) {
    smem[off + i] = i < 2 * kRank * N ? dyn[i] : gate[i - 2 * kRank * N];
  }
}

// Which group a block serves (blockIdx.y indexes the launch's list, dcmha_plan.h): sets t0
// and count, false when the slot is empty.
__device__ __forceinline__ bool FindGroup(const Params& p, int& t0, int& count) {
  const int g = blockIdx.y;
  if (p.groups == nullptr) {  // the wave's tokens one by one
    t0 = p.tw0 + g;
    count = 1;
    return t0 < p.tw1;
  }
  if (g >= p.groups[0]) return false;
  t0 = p.groups[1 + 2 * g];
  count = p.groups[2 + 2 * g];
  return true;
}

// ---------------------------------------------------------------------------------------
// Host side: what both attention passes do around their launch.

// Raises `kernel`'s dynamic shared-memory limit when `smem` bytes are above the default
// 48 KiB.
template <typename Kernel>
cudaError_t AllowDynamicSmem(Kernel kernel, size_t smem) {
  if (smem <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(smem));
}

// Dispatches a pass to Pass<CT, VEC, QB>::Launch(p, num_groups, stream) for the cache's
// element type CT, the vector width VEC of p (kVec or 1) and QB queries per block (1, or
// kChunkQueries when qb > 1).
template <template <typename, int, int> class Pass, typename CT>
cudaError_t DispatchPassShape(const Params& p, int qb, int num_groups, cudaStream_t stream) {
  if (p.vec == kVec) {
    return qb == 1 ? Pass<CT, kVec, 1>::Launch(p, num_groups, stream)
                   : Pass<CT, kVec, kChunkQueries>::Launch(p, num_groups, stream);
  }
  return qb == 1 ? Pass<CT, 1, 1>::Launch(p, num_groups, stream)
                 : Pass<CT, 1, kChunkQueries>::Launch(p, num_groups, stream);
}

template <template <typename, int, int> class Pass>
cudaError_t DispatchPass(const Params& p, ElemType cache_dtype, int qb, int num_groups,
                         cudaStream_t stream) {
  if (num_groups <= 0) return cudaSuccess;
  switch (cache_dtype) {
    case ElemType::kF32:
      return DispatchPassShape<Pass, float>(p, qb, num_groups, stream);
    case ElemType::kBF16:
      return DispatchPassShape<Pass, __nv_bfloat16>(p, qb, num_groups, stream);
    case ElemType::kF16:
      return DispatchPassShape<Pass, __half>(p, qb, num_groups, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace dcmha
}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
