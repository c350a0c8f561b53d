// The DCMHA decode kernels (dcmha_plan.h, "Decode steps"): both passes for steps whose
// sequences have one new token each, sized so that batch 1 fills the GPU.
//
// Pass 1, block (split, token), ThreadsFor(nvec) threads; thread v owns vector slot v of a
// K row and holds the query's slice, pre-scaled by 1/sqrt(hd). Per tile of kDecodeScoreTile
// keys:
//   0. warp 0: the tile's row offsets, one block-table read per cache block (the first key of
//      each block in the tile reads it, a shuffle hands it to the others) -> shared;
//   A. every thread: its K slice of every key of the tile into registers (all loads issued
//      before the first is used), then the partial dot products -> shared;
//   B. one group of LanesPerPair(N) lanes per key: per-head sums, pre-compose -> S';
//   C. thread per head: online max and sum.
// Then the split's (max, sum) per head; the split that finishes last merges all of them.
//
// Pass 2, block (split, head group, token), DecodeOutputThreads threads; thread
// (key lane l, slot s) owns slot s of the group's G heads and the keys l, l + lanes, ...
// of each tile. Per tile of kDecodeOutputTile keys:
//   0. as in pass 1;
//   A. one group of LanesPerPair(N) lanes per key: P = exp(S' - M) / Z for all heads,
//      post-compose, P' of the group's heads -> shared;
//   B. every thread: its V slice of up to 4 keys at once (loads first), times P'.
// Then the key lanes' sums in lane order; one split writes `out`, several write partial
// rows and the last to finish adds them in split order.
#include <cmath>

#include "engine/simt/cuda_compat.h"
#include "engine/cuda/dcmha_device.cuh"
#include "engine/cuda/dcmha_plan.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace dcmha {
namespace {

// Row offsets in shared memory: an element offset into the cache, or one of these.
constexpr long long kMissingRow = -1;  // no block: the row reads as zeros
constexpr long long kFreshRow = -2;    // the token's own key: the step's fresh inputs

// Warp 0 (all 32 lanes): row offsets of keys [k0, k0 + kn) of decode token `t` at `pos`
// into row_off[0, kn). kn <= 32.
template <typename Smem>
__device__ __forceinline__ void TileRowOffsets(const Params& p, int seq, int pos, int k0, int kn,
                                               Smem& row_off) {
  const int lane = threadIdx.x % 32;
  const int key = k0 + lane;
  const bool used = lane < kn;
  // Keys are consecutive: the first lane of each cache block's run reads the table.
  const int in_block = key % p.block_size;
  const int leader = lane > in_block ? lane - in_block : 0;
  int blk = -1;
  if (used && lane == leader && key < pos) {
    blk = p.block_table[static_cast<int64_t>(seq) * p.blocks_per_seq + key / p.block_size];
  }
  blk = __shfl_sync(kFullMask, blk, leader);
  if (!used) return;
  long long off = kMissingRow;
  if (key >= pos) {
    off = kFreshRow;
  } else if (blk >= 0 && blk < p.num_blocks) {
    off = static_cast<long long>(blk) * p.block_elems + p.layer_offset +
          static_cast<long long>(in_block) * p.row_elems;
  }
  row_off[lane] = off;
}

// Elements [e, e + VEC) of K (part 0) or V (part 1) of the row at `off` (decode token t's
// own when fresh), zero where the row is missing.
template <typename CT, int VEC>
__device__ __forceinline__ void LoadRowPart(const Params& p, long long off, int t, int part, int e,
                                            float (&v)[VEC]) {
  const int nhd = p.n_head * p.head_dim;
  if (off >= 0) {
    LoadVec<CT, VEC>(static_cast<const CT*>(p.cache) + off + part * nhd + e, v);
  } else if (off == kFreshRow) {
    LoadFresh<VEC>(p.qkv + t * p.qkv_stride + (1 + part) * nhd + e, p.fresh_vec_ok, v);
  } else {
    DCF_UNROLL
    for (int i = 0; i < VEC; ++i) v[i] = 0.0f;
  }
}

using dev::RawSlice;  // a K slice as loaded (device_util.cuh)

template <typename CT>
__device__ __forceinline__ KeyRow<CT> RowAt(const Params& p, long long off, int t) {
  if (off >= 0) return KeyRow<CT>{static_cast<const CT*>(p.cache) + off, -1};
  return KeyRow<CT>{nullptr, off == kFreshRow ? t : -1};
}

// A value another block of this launch wrote before its __threadfence (not from L1).
__device__ __forceinline__ float LoadOther(const float* p) {
  return *static_cast<const volatile float*>(p);
}

template <typename CT, int VEC>
__global__ void __launch_bounds__(kMaxThreads) DcmhaDecodeScoresKernel(Params p) {
  DCF_DYNAMIC_SHARED(float, smem);
  DCF_SHARED(long long, row_off, kDecodeScoreTile);
  DCF_SHARED(int, is_last, 1);
  // The same bytes in flight per thread for every cache dtype (f32 slices are twice as big).
  constexpr int KT = sizeof(CT) == 4 ? kDecodeScoreTile / 2 : kDecodeScoreTile;
  const int t = blockIdx.y;
  const int seq = p.token_seq[t];
  const int pos = p.positions[t];
  const int split = blockIdx.x;
  const DecodeSplit range = SplitOfToken(pos, p.window, p.split_target, p.min_split_keys, split);
  if (split >= range.count) return;
  const int lo = range.lo, num_splits = range.count;
  const int key_begin = range.begin, key_end = range.end;

  const int N = p.n_head;
  const int nvec = p.nvec;
  const int slots_per_head = p.head_dim / VEC;
  const int terms = (2 * kRank + 1) * N;
  const int part0 = 0;               // [KT][nvec] partial dot products
  const int sc0 = part0 + KT * nvec; // [KT][N] S' of the tile
  const int qt0 = sc0 + KT * N;      // [5N] query pre-compose terms
  const int max0 = qt0 + terms;      // [N] running max
  const int sum0 = max0 + N;         // [N] running sum of exp(S' - max)

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int num_warps = blockDim.x / 32;
  const int width = LanesPerPair(N);
  const int pairs_per_warp = 32 / width;
  const int pair_slot = tid % 32 / width;
  const int sub = tid % width;

  const bool has_slot = tid < nvec;
  float q[VEC];
  DCF_UNROLL
  for (int e = 0; e < VEC; ++e) q[e] = 0.0f;
  if (has_slot) {
    LoadFresh<VEC>(p.qkv + t * p.qkv_stride + tid * VEC, p.fresh_vec_ok, q);
    DCF_UNROLL
    for (int e = 0; e < VEC; ++e) q[e] *= p.scale;
  }
  if (p.compose) LoadQueryTerms(p, t, 0, smem, qt0);
  for (int i = tid; i < N; i += blockDim.x) {
    smem[max0 + i] = -INFINITY;
    smem[sum0 + i] = 0.0f;
  }

  for (int k0 = key_begin; k0 < key_end; k0 += KT) {
    const int kn = min(KT, key_end - k0);
    if (warp == 0) TileRowOffsets(p, seq, pos, k0, kn, row_off);
    __syncthreads();

    // A. Every cached key's slice first, then the dot products (the fresh key, at most the
    // tile's last, is read from the step's inputs when its turn comes).
    if (has_slot) {
      RawSlice<CT, VEC> raw[KT];
      DCF_UNROLL
      for (int kk = 0; kk < KT; ++kk) {
        const long long off = kk < kn ? row_off[kk] : kMissingRow;
        if (off >= 0) {
          raw[kk].Load(static_cast<const CT*>(p.cache) + off + tid * VEC);
        } else {
          raw[kk].Zero();
        }
      }
      DCF_UNROLL
      for (int kk = 0; kk < KT; ++kk) {
        if (kk < kn) {
          float k[VEC];
          if (row_off[kk] == kFreshRow) {
            LoadRowPart<CT, VEC>(p, kFreshRow, t, 0, tid * VEC, k);
          } else {
            raw[kk].Unpack(k);
          }
          float dot = 0.0f;
          DCF_UNROLL
          for (int e = 0; e < VEC; ++e) dot += q[e] * k[e];
          smem[part0 + kk * nvec + tid] = dot;
        }
      }
    }
    __syncthreads();

    // B. Head sums and pre-compose, one lane group per key (groups without a key still
    // join the shuffles).
    for (int base = warp * pairs_per_warp; base < kn; base += num_warps * pairs_per_warp) {
      const int kk = base + pair_slot;
      const bool used = kk < kn;
      float s[kMaxHeadsPerLane];
      DCF_UNROLL
      for (int j = 0; j < kMaxHeadsPerLane; ++j) {
        const int m = sub + width * j;
        s[j] = 0.0f;
        if (used && m < N) {
          const int pbase = part0 + kk * nvec + m * slots_per_head;
          for (int g = 0; g < slots_per_head; ++g) s[j] += smem[pbase + g];
        }
      }
      if (p.compose) {
        const KeyRow<CT> row = used ? RowAt<CT>(p, row_off[kk], t) : KeyRow<CT>{nullptr, -1};
        ComposeGroup(N, sub, width, smem, qt0, KeyTerms<CT>(p, row, 0), s);
      }
      if (!used) continue;
      float* dst = p.scores + t * p.ld_scores + static_cast<int64_t>(k0 + kk - lo) * N;
      DCF_UNROLL
      for (int j = 0; j < kMaxHeadsPerLane; ++j) {
        const int m = sub + width * j;
        if (m < N) {
          smem[sc0 + kk * N + m] = s[j];
          dst[m] = s[j];
        }
      }
    }
    __syncthreads();

    // C. Online max / sum per head; each head always has the same owner thread.
    for (int n = tid; n < N; n += blockDim.x) {
      float mx = smem[max0 + n];
      float sum = smem[sum0 + n];
      for (int kk = 0; kk < kn; ++kk) {
        const float x = smem[sc0 + kk * N + n];
        if (x > mx) {
          sum = sum * expf(mx - x) + 1.0f;
          mx = x;
        } else {
          sum += expf(x - mx);
        }
      }
      smem[max0 + n] = mx;
      smem[sum0 + n] = sum;
    }
    // The next tile's row offsets and step A write only row_off and part, which this tile
    // read before the barrier above; its step B rewrites sc after two more barriers.
  }

  if (num_splits == 1) {
    for (int n = tid; n < N; n += blockDim.x) {
      p.final_max[t * N + n] = smem[max0 + n];
      p.final_inv[t * N + n] = 1.0f / smem[sum0 + n];
    }
    return;
  }
  for (int n = tid; n < N; n += blockDim.x) {
    const int64_t at = (static_cast<int64_t>(t) * p.max_splits + split) * N + n;
    p.stat_max[at] = smem[max0 + n];
    p.stat_sum[at] = smem[sum0 + n];
  }
  // The last split of the token to finish merges every split's statistics.
  __threadfence();
  __syncthreads();
  if (tid == 0) is_last[0] = atomicAdd(&p.counters[t], 1) == num_splits - 1 ? 1 : 0;
  __syncthreads();
  if (is_last[0] == 0) return;
  __threadfence();
  int tph = 1;  // threads per head, each merging a share of the splits
  while (tph < 32 && N * tph * 2 <= static_cast<int>(blockDim.x)) tph *= 2;
  for (int n0 = 0; n0 < N; n0 += blockDim.x / tph) {  // one round unless tph == 1
    const int n = n0 + tid / tph;
    const int share = tid % tph;
    float mx = -INFINITY, sum = 0.0f;
    if (n < N) {
      const int64_t row = static_cast<int64_t>(t) * p.max_splits;
      for (int x = share; x < num_splits; x += tph) {
        MergeStats(mx, sum, LoadOther(&p.stat_max[(row + x) * N + n]),
                   LoadOther(&p.stat_sum[(row + x) * N + n]));
      }
    }
    for (int mask = tph / 2; mask > 0; mask /= 2) {
      const float other_max = __shfl_xor_sync(kFullMask, mx, mask);
      const float other_sum = __shfl_xor_sync(kFullMask, sum, mask);
      MergeStats(mx, sum, other_max, other_sum);
    }
    if (n < N && share == 0) {
      p.final_max[t * N + n] = mx;
      p.final_inv[t * N + n] = 1.0f / sum;
    }
  }
  if (tid == 0) p.counters[t] = 0;  // ready for the next launch
}

template <typename CT, int VEC>
__global__ void __launch_bounds__(kMaxThreads) DcmhaDecodeOutputKernel(Params p) {
  DCF_DYNAMIC_SHARED(float, smem);
  DCF_SHARED(long long, row_off, kDecodeOutputTile);
  DCF_SHARED(int, is_last, 1);
  constexpr int KT = kDecodeOutputTile;
  constexpr int kInFlight = 4;  // V slices a thread loads before using the first
  const int t = blockIdx.z;
  const int hg = blockIdx.y;
  const int seq = p.token_seq[t];
  const int pos = p.positions[t];
  const int split = blockIdx.x;
  const DecodeSplit range = SplitOfToken(pos, p.window, p.split_target2, p.min_split_keys2, split);
  if (split >= range.count) return;
  const int lo = range.lo, num_splits = range.count;
  const int key_begin = range.begin, key_end = range.end;

  const int N = p.n_head;
  const int hd = p.head_dim;
  const int G = p.group_heads;
  const int g0 = hg * G;  // the group's first head
  const int slots_per_head = hd / VEC;
  const int group_slots = G * slots_per_head;
  const int key_lanes = static_cast<int>(blockDim.x) / group_slots;
  const int terms = (2 * kRank + 1) * N;
  const int max0 = 0;              // [N] softmax max M
  const int inv0 = max0 + N;       // [N] 1 / Z
  const int qt0 = inv0 + N;        // [5N] query post-compose terms
  const int tile0 = qt0 + terms;   // [KT][G] P' of the group's heads, then the lane sums

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int num_warps = blockDim.x / 32;
  const int width = LanesPerPair(N);
  const int pairs_per_warp = 32 / width;
  const int pair_slot = tid % 32 / width;
  const int sub = tid % width;
  const int slot = tid % group_slots;
  const int lane_k = tid / group_slots;  // key lane
  const bool active = lane_k < key_lanes;
  const int head_in_group = slot / slots_per_head;
  const int elem = g0 * hd + slot * VEC;  // first element of the slot in a V row

  for (int i = tid; i < N; i += blockDim.x) {
    smem[max0 + i] = p.final_max[t * N + i];
    smem[inv0 + i] = p.final_inv[t * N + i];
  }
  if (p.compose) LoadQueryTerms(p, t, 2, smem, qt0);
  float acc[VEC];
  DCF_UNROLL
  for (int e = 0; e < VEC; ++e) acc[e] = 0.0f;

  for (int k0 = key_begin; k0 < key_end; k0 += KT) {
    const int kn = min(KT, key_end - k0);
    if (warp == 0) TileRowOffsets(p, seq, pos, k0, kn, row_off);
    __syncthreads();

    // A. Probabilities and post-compose for all heads; P' of the group's heads to shared.
    for (int base = warp * pairs_per_warp; base < kn; base += num_warps * pairs_per_warp) {
      const int kk = base + pair_slot;
      const bool used = kk < kn;
      const float* src = p.scores + t * p.ld_scores + static_cast<int64_t>(used ? k0 + kk - lo : 0) * N;
      float s[kMaxHeadsPerLane];
      DCF_UNROLL
      for (int j = 0; j < kMaxHeadsPerLane; ++j) {
        const int m = sub + width * j;
        s[j] = used && m < N ? expf(src[m] - smem[max0 + m]) * smem[inv0 + m] : 0.0f;
      }
      if (p.compose) {
        const KeyRow<CT> row = used ? RowAt<CT>(p, row_off[kk], t) : KeyRow<CT>{nullptr, -1};
        ComposeGroup(N, sub, width, smem, qt0, KeyTerms<CT>(p, row, 1), s);
      }
      if (!used) continue;
      DCF_UNROLL
      for (int j = 0; j < kMaxHeadsPerLane; ++j) {
        const int m = sub + width * j;
        if (m >= g0 && m < g0 + G) smem[tile0 + kk * G + (m - g0)] = s[j];
      }
    }
    __syncthreads();

    // B. P' V for this thread's slot and keys, kInFlight V slices loaded at a time.
    if (active) {
      for (int kb = lane_k; kb < kn; kb += kInFlight * key_lanes) {
        float v[kInFlight][VEC];
        DCF_UNROLL
        for (int u = 0; u < kInFlight; ++u) {
          const int kk = kb + u * key_lanes;
          if (kk < kn) {
            LoadRowPart<CT, VEC>(p, row_off[kk], t, 1, elem, v[u]);
          } else {
            DCF_UNROLL
            for (int e = 0; e < VEC; ++e) v[u][e] = 0.0f;
          }
        }
        DCF_UNROLL
        for (int u = 0; u < kInFlight; ++u) {
          const int kk = kb + u * key_lanes;
          if (kk < kn) {
            const float w = smem[tile0 + kk * G + head_in_group];
            DCF_UNROLL
            for (int e = 0; e < VEC; ++e) acc[e] += w * v[u][e];
          }
        }
      }
    }
    __syncthreads();
  }

  // The key lanes' sums, added in lane order.
  if (active) {
    DCF_UNROLL
    for (int e = 0; e < VEC; ++e) smem[tile0 + (lane_k * group_slots + slot) * VEC + e] = acc[e];
  }
  __syncthreads();
  const int nhd = N * hd;
  const int group_elems = G * hd;
  float* my_partial =
      p.partial2 + ((static_cast<int64_t>(t) * p.num_head_groups + hg) * p.max_splits2 + split) *
                       group_elems;
  if (tid < group_slots) {
    DCF_UNROLL
    for (int e = 0; e < VEC; ++e) {
      float r = 0.0f;
      for (int l = 0; l < key_lanes; ++l) r += smem[tile0 + (l * group_slots + tid) * VEC + e];
      if (num_splits == 1) {
        StoreAs(p.out_dtype, p.out, static_cast<int64_t>(t) * nhd + elem + e, r);
      } else {
        my_partial[tid * VEC + e] = r;
      }
    }
  }
  if (num_splits == 1) return;
  // The last split of this (token, head group) to finish adds the partials in split order.
  __threadfence();
  __syncthreads();
  int32_t* counter = p.counters + gridDim.z + t * p.num_head_groups + hg;
  if (tid == 0) is_last[0] = atomicAdd(counter, 1) == num_splits - 1 ? 1 : 0;
  __syncthreads();
  if (is_last[0] == 0) return;
  __threadfence();
  const float* first =
      p.partial2 + (static_cast<int64_t>(t) * p.num_head_groups + hg) * p.max_splits2 * group_elems;
  for (int e = tid; e < group_elems; e += blockDim.x) {
    float r = 0.0f;
    for (int x = 0; x < num_splits; ++x) r += LoadOther(first + static_cast<int64_t>(x) * group_elems + e);
    StoreAs(p.out_dtype, p.out, static_cast<int64_t>(t) * nhd + g0 * hd + e, r);
  }
  if (tid == 0) *counter = 0;  // ready for the next launch
}

template <typename CT, int VEC>
cudaError_t LaunchScoresAs(const Params& p, int num_tokens, cudaStream_t stream) {
  const size_t smem = sizeof(float) * DecodeScoresSmemFloats(p.nvec, p.n_head);
  const cudaError_t e = AllowDynamicSmem(DcmhaDecodeScoresKernel<CT, VEC>, smem);
  if (e != cudaSuccess) return e;
  const dim3 grid(p.max_splits, num_tokens);
  DCF_LAUNCH((DcmhaDecodeScoresKernel<CT, VEC>), grid, ThreadsFor(p.nvec), smem, stream, p);
  return cudaGetLastError();
}

template <typename CT, int VEC>
cudaError_t LaunchOutputAs(const Params& p, int num_tokens, cudaStream_t stream) {
  const int group_slots = p.group_heads * (p.head_dim / VEC);
  const int threads = DecodeOutputThreads(group_slots);
  const size_t smem = sizeof(float) * DecodeOutputSmemFloats(p.n_head, p.group_heads,
                                                             group_slots, VEC, threads);
  const cudaError_t e = AllowDynamicSmem(DcmhaDecodeOutputKernel<CT, VEC>, smem);
  if (e != cudaSuccess) return e;
  const dim3 grid(p.max_splits2, p.num_head_groups, num_tokens);
  DCF_LAUNCH((DcmhaDecodeOutputKernel<CT, VEC>), grid, threads, smem, stream, p);
  return cudaGetLastError();
}

// Dispatches on the cache's element type and p.vec.
#define DCMHA_DISPATCH_DECODE(FN, p, cache_dtype, num_tokens, stream)                    \
  do {                                                                                   \
    const bool v8 = (p).vec == kVec;                                                     \
    switch (cache_dtype) {                                                               \
      case ElemType::kF32:                                                               \
        return v8 ? FN<float, kVec>(p, num_tokens, stream)                               \
                  : FN<float, 1>(p, num_tokens, stream);                                 \
      case ElemType::kBF16:                                                              \
        return v8 ? FN<__nv_bfloat16, kVec>(p, num_tokens, stream)                       \
                  : FN<__nv_bfloat16, 1>(p, num_tokens, stream);                         \
      case ElemType::kF16:                                                               \
        return v8 ? FN<__half, kVec>(p, num_tokens, stream) : FN<__half, 1>(p, num_tokens, \
                                                                            stream);     \
    }                                                                                    \
    return cudaErrorInvalidValue;                                                        \
  } while (0)

}  // namespace

cudaError_t LaunchDecodeScores(const Params& p, ElemType cache_dtype, int num_tokens,
                               cudaStream_t stream) {
  if (num_tokens <= 0) return cudaSuccess;
  DCMHA_DISPATCH_DECODE(LaunchScoresAs, p, cache_dtype, num_tokens, stream);
}

cudaError_t LaunchDecodeOutput(const Params& p, ElemType cache_dtype, int num_tokens,
                               cudaStream_t stream) {
  if (num_tokens <= 0) return cudaSuccess;
  DCMHA_DISPATCH_DECODE(LaunchOutputAs, p, cache_dtype, num_tokens, stream);
}

}  // namespace dcmha
}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
