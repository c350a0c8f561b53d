// Pass 2 of DCMHA attention (dcmha_plan.h): softmax statistics from pass 1's splits,
// normalised probabilities, post-compose, and P' V; plus the reduction over splits.
//
// Block: one (split, group); ThreadsFor(nvec) threads, thread v owning vector slot v of the
// output row (elements [v * VEC, v * VEC + VEC) of head v / (hd / VEC)) for every query of the
// group, accumulated in registers. Per tile of key rows:
//   A. one group of LanesPerPair(N) lanes per (query, key): P = exp(S' - M) / Z for all
//      heads, post-compose -> shared;
//   B. every thread: its slot of V for each key, times the key's P' of its head.
// One split writes `out`; several write f32 partial rows that DcmhaSplitReduce adds up.
#include <cmath>

#include "engine/simt/cuda_compat.h"
#include "engine/cuda/dcmha_device.cuh"
#include "engine/cuda/dcmha_plan.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace dcmha {
namespace {

template <typename CT, int VEC, int QB>
__global__ void __launch_bounds__(kMaxThreads) DcmhaOutputKernel(Params p) {
  DCF_DYNAMIC_SHARED(float, smem);
  int t0 = 0, nq = 0;
  if (!FindGroup(p, t0, nq)) return;
  const int N = p.n_head;
  const int nhd = N * p.head_dim;
  const int slots_per_head = p.head_dim / VEC;
  const int seq = p.token_seq[t0];
  const int tok0 = p.seq_offsets[seq];
  const int start = p.positions[tok0];
  const int pos0 = p.positions[t0];
  const int lo_u = Lo(pos0, p.window);
  const int keys = pos0 + nq - lo_u;
  const int num_splits = (keys + p.split_keys - 1) / p.split_keys;
  const int split = blockIdx.x;
  if (split >= num_splits) return;
  const int key_begin = lo_u + split * p.split_keys;
  const int key_end = min(lo_u + keys, key_begin + p.split_keys);

  const int KT = OutputKeyTile(QB, N);
  const int terms = (2 * kRank + 1) * N;
  const int max0 = 0;                // [QB][N] softmax max M over all splits
  const int inv0 = max0 + QB * N;    // [QB][N] 1 / Z
  const int qt0 = inv0 + QB * N;     // [QB][5N] query post-compose terms
  const int pp0 = qt0 + QB * terms;  // [QB][KT][N] P' of the tile (0: masked)

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int num_warps = blockDim.x / 32;
  const int width = LanesPerPair(N);  // lanes per (query, key) in step A
  const int pairs_per_warp = 32 / width;
  const int pair_slot = tid % 32 / width;
  const int sub = tid % width;
  const int tl0 = t0 - p.tw0;

  // Softmax statistics of each (query, head) from the splits' (max, sum): `tph` threads
  // per entry merge a share of the splits each, then combine by shuffles.
  const int entries = nq * N;
  int tph = 1;
  while (tph < 32 && entries * tph * 2 <= static_cast<int>(blockDim.x)) tph *= 2;
  for (int e0 = 0; e0 < entries; e0 += blockDim.x / tph) {  // one round unless tph == 1
    const int i = e0 + tid / tph;
    const int part = tid % tph;
    float mx = -INFINITY, sum = 0.0f;
    if (i < entries) {
      const int64_t row = static_cast<int64_t>(tl0 + i / N) * p.max_splits;
      for (int x = part; x < num_splits; x += tph) {
        MergeStats(mx, sum, p.stat_max[(row + x) * N + i % N], p.stat_sum[(row + x) * N + i % N]);
      }
    }
    for (int mask = tph / 2; mask > 0; mask /= 2) {
      const float other_max = __shfl_xor_sync(kFullMask, mx, mask);
      const float other_sum = __shfl_xor_sync(kFullMask, sum, mask);
      MergeStats(mx, sum, other_max, other_sum);
    }
    if (i < entries && part == 0) {
      smem[max0 + i] = mx;
      smem[inv0 + i] = sum > 0.0f ? 1.0f / sum : 0.0f;
    }
  }
  if (p.compose) {
    for (int qi = 0; qi < nq; ++qi) LoadQueryTerms(p, t0 + qi, 2, smem, qt0 + qi * terms);
  }
  const bool has_slot = tid < p.nvec;
  const int head = tid / slots_per_head;
  float acc[QB][VEC];
  DCF_UNROLL
  for (int qi = 0; qi < QB; ++qi) {
    DCF_UNROLL
    for (int e = 0; e < VEC; ++e) acc[qi][e] = 0.0f;
  }
  __syncthreads();

  for (int k0 = key_begin; k0 < key_end; k0 += KT) {
    const int kn = min(KT, key_end - k0);
    // A. Probabilities and post-compose, one group of `width` lanes per (query, key);
    // masked pairs get P' = 0. Groups without a pair still join the shuffles.
    for (int base = warp * pairs_per_warp; base < nq * kn; base += num_warps * pairs_per_warp) {
      const int pair = base + pair_slot;
      const bool used = pair < nq * kn;
      const int qi = used ? pair / kn : 0;
      const int kk = used ? pair % kn : 0;
      const int key = k0 + kk;
      const int lo = Lo(pos0 + qi, p.window);
      const bool visible = used && key >= lo && key <= pos0 + qi;
      const float* src =
          p.scores + (tl0 + qi) * p.ld_scores + static_cast<int64_t>(visible ? key - lo : 0) * N;
      float s[kMaxHeadsPerLane];
      DCF_UNROLL
      for (int j = 0; j < kMaxHeadsPerLane; ++j) {
        const int m = sub + width * j;
        s[j] = visible && m < N ? expf(src[m] - smem[max0 + qi * N + m]) * smem[inv0 + qi * N + m]
                                : 0.0f;
      }
      if (p.compose) {
        const KeyRow<CT> row =
            visible ? FindKeyRow<CT>(p, seq, start, tok0, key) : KeyRow<CT>{nullptr, -1};
        ComposeGroup(N, sub, width, smem, qt0 + qi * terms, KeyTerms<CT>(p, row, 1), s);
      }
      if (!used) continue;
      const int pbase = pp0 + (qi * KT + kk) * N;
      DCF_UNROLL
      for (int j = 0; j < kMaxHeadsPerLane; ++j) {
        const int m = sub + width * j;
        if (m < N) smem[pbase + m] = visible ? s[j] : 0.0f;
      }
    }
    __syncthreads();

    // B. Accumulate P' V for this thread's slot.
    if (has_slot) {
      for (int kk = 0; kk < kn; ++kk) {
        const KeyRow<CT> row = FindKeyRow<CT>(p, seq, start, tok0, k0 + kk);
        float v[VEC];
        LoadKv<CT, VEC>(p, row, 1, tid * VEC, v);
        DCF_UNROLL
        for (int qi = 0; qi < QB; ++qi) {
          if (qi < nq) {
            const float w = smem[pp0 + (qi * KT + kk) * N + head];
            DCF_UNROLL
            for (int e = 0; e < VEC; ++e) acc[qi][e] += w * v[e];
          }
        }
      }
    }
    __syncthreads();
  }

  if (!has_slot) return;
  DCF_UNROLL
  for (int qi = 0; qi < QB; ++qi) {
    if (qi >= nq) break;
    if (num_splits == 1) {
      const int64_t at = static_cast<int64_t>(t0 + qi) * nhd + tid * VEC;
      DCF_UNROLL
      for (int e = 0; e < VEC; ++e) StoreAs(p.out_dtype, p.out, at + e, acc[qi][e]);
    } else {
      float* dst =
          p.partial + (static_cast<int64_t>(tl0 + qi) * p.max_splits + split) * nhd + tid * VEC;
      DCF_UNROLL
      for (int e = 0; e < VEC; ++e) dst[e] = acc[qi][e];
    }
  }
}

// out[t] = sum of the token's split partials, for tokens whose group used several splits.
// Grid (ceil(N * hd / 64), wave tokens), 256 threads: 64 elements x 4 interleaved shares of
// the splits, added in a fixed order (deterministic).
constexpr int kReduceElems = 64;
constexpr int kReduceShares = 4;
__global__ void __launch_bounds__(kReduceElems* kReduceShares) DcmhaSplitReduceKernel(Params p) {
  DCF_SHARED(float, shares, kReduceElems* kReduceShares);
  const int tl = blockIdx.y;
  const int nhd = p.n_head * p.head_dim;
  const int num_splits = p.splits[tl];
  if (num_splits <= 1) return;  // pass 2 wrote `out` itself
  const int col = threadIdx.x % kReduceElems;
  const int share = threadIdx.x / kReduceElems;
  const int e = blockIdx.x * kReduceElems + col;
  float sum = 0.0f;
  if (e < nhd) {
    const float* src = p.partial + static_cast<int64_t>(tl) * p.max_splits * nhd + e;
    for (int x = share; x < num_splits; x += kReduceShares)
      sum += src[static_cast<int64_t>(x) * nhd];
  }
  shares[threadIdx.x] = sum;
  __syncthreads();
  if (share == 0 && e < nhd) {
    for (int k = 1; k < kReduceShares; ++k) sum += shares[k * kReduceElems + col];
    StoreAs(p.out_dtype, p.out, static_cast<int64_t>(p.tw0 + tl) * nhd + e, sum);
  }
}

// One instantiation of the pass, for DispatchPass (dcmha_device.cuh).
template <typename CT, int VEC, int QB>
struct OutputPass {
  static cudaError_t Launch(const Params& p, int num_groups, cudaStream_t stream) {
    const size_t smem = sizeof(float) * OutputSmemFloats(QB, p.n_head);
    const cudaError_t e = AllowDynamicSmem(DcmhaOutputKernel<CT, VEC, QB>, smem);
    if (e != cudaSuccess) return e;
    const dim3 grid(p.max_splits, num_groups);
    DCF_LAUNCH((DcmhaOutputKernel<CT, VEC, QB>), grid, ThreadsFor(p.nvec), smem, stream, p);
    return cudaGetLastError();
  }
};

}  // namespace

cudaError_t LaunchOutput(const Params& p, ElemType cache_dtype, int qb, int num_groups,
                         cudaStream_t stream) {
  return DispatchPass<OutputPass>(p, cache_dtype, qb, num_groups, stream);
}

cudaError_t LaunchSplitReduce(const Params& p, cudaStream_t stream) {
  const int nhd = p.n_head * p.head_dim;
  const dim3 grid((nhd + kReduceElems - 1) / kReduceElems, p.tw1 - p.tw0);
  DCF_LAUNCH(DcmhaSplitReduceKernel, grid, kReduceElems * kReduceShares, 0, stream, p);
  return cudaGetLastError();
}

}  // namespace dcmha
}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
