// Pass 1 of DCMHA attention (dcmha_plan.h): composed scores S' and per-split softmax
// statistics.
//
// Block: one (split, group); ThreadsFor(nvec) threads. Thread v owns vector slot v of a key
// row (elements [v * VEC, v * VEC + VEC) of K, i.e. head v / (hd / VEC)) and keeps the
// matching slice of each query of the group in registers. Per tile of key rows:
//   A. every thread: partial dot products of its slot for each (query, key) -> shared `part`;
//   B. one group of LanesPerPair(N) lanes per (query, key): per-head sums of the partials,
//      pre-compose with the key's cached terms, S' -> shared `sc` and the workspace;
//   C. thread per (query, head): running max and sum of exp over the tile (online softmax
//      statistics, in shared memory; no reductions across threads).
#include <cmath>

#include "engine/simt/cuda_compat.h"
#include "engine/cuda/dcmha_device.cuh"
#include "engine/cuda/dcmha_plan.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace dcmha {
namespace {

template <typename CT, int VEC, int QB>
__global__ void __launch_bounds__(kMaxThreads) DcmhaScoresKernel(Params p) {
  DCF_DYNAMIC_SHARED(float, smem);
  int t0 = 0, nq = 0;
  if (!FindGroup(p, t0, nq)) return;
  const int N = p.n_head;
  const int nvec = p.nvec;
  const int slots_per_head = p.head_dim / VEC;
  const int seq = p.token_seq[t0];
  const int tok0 = p.seq_offsets[seq];
  const int start = p.positions[tok0];
  const int pos0 = p.positions[t0];
  const int lo_u = Lo(pos0, p.window);
  const int keys = pos0 + nq - lo_u;  // the group's keys: [lo_u, pos0 + nq)
  const int num_splits = (keys + p.split_keys - 1) / p.split_keys;
  const int split = blockIdx.x;
  if (split >= num_splits) return;
  const int key_begin = lo_u + split * p.split_keys;
  const int key_end = min(lo_u + keys, key_begin + p.split_keys);

  const int KT = ScoresKeyTile(QB, nvec);
  const int terms = (2 * kRank + 1) * N;
  const int part0 = 0;                     // [QB][KT][nvec] partial dot products
  const int sc0 = part0 + QB * KT * nvec;  // [QB][KT][N] S' of the tile (-inf: masked)
  const int qt0 = sc0 + QB * KT * N;       // [QB][5N] query pre-compose terms
  const int max0 = qt0 + QB * terms;       // [QB][N] running max
  const int sum0 = max0 + QB * N;          // [QB][N] running sum of exp(S' - max)

  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int num_warps = blockDim.x / 32;
  const int width = LanesPerPair(N);  // lanes per (query, key) in step B
  const int pairs_per_warp = 32 / width;
  const int pair_slot = tid % 32 / width;
  const int sub = tid % width;
  const int tl0 = t0 - p.tw0;  // the group's first token within the wave
  if (split == 0 && tid < nq) p.splits[tl0 + tid] = num_splits;

  // This thread's slice of each query, pre-scaled by 1/sqrt(hd).
  const bool has_slot = tid < nvec;
  float q[QB][VEC];
  DCF_UNROLL
  for (int qi = 0; qi < QB; ++qi) {
    DCF_UNROLL
    for (int e = 0; e < VEC; ++e) q[qi][e] = 0.0f;
    if (has_slot && qi < nq) {
      LoadFresh<VEC>(p.qkv + (t0 + qi) * p.qkv_stride + tid * VEC, p.fresh_vec_ok, q[qi]);
      DCF_UNROLL
      for (int e = 0; e < VEC; ++e) q[qi][e] *= p.scale;
    }
  }
  if (p.compose) {
    for (int qi = 0; qi < nq; ++qi) LoadQueryTerms(p, t0 + qi, 0, smem, qt0 + qi * terms);
  }
  for (int i = tid; i < nq * N; i += blockDim.x) {
    smem[max0 + i] = -INFINITY;
    smem[sum0 + i] = 0.0f;
  }
  __syncthreads();

  for (int k0 = key_begin; k0 < key_end; k0 += KT) {
    const int kn = min(KT, key_end - k0);
    // A. Partial dot products of this thread's slot.
    if (has_slot) {
      for (int kk = 0; kk < kn; ++kk) {
        const KeyRow<CT> row = FindKeyRow<CT>(p, seq, start, tok0, k0 + kk);
        float k[VEC];
        LoadKv<CT, VEC>(p, row, 0, tid * VEC, k);
        DCF_UNROLL
        for (int qi = 0; qi < QB; ++qi) {
          if (qi < nq) {
            float dot = 0.0f;
            DCF_UNROLL
            for (int e = 0; e < VEC; ++e) dot += q[qi][e] * k[e];
            smem[part0 + (qi * KT + kk) * nvec + tid] = dot;
          }
        }
      }
    }
    __syncthreads();

    // B. Head sums and pre-compose: each lane group of `width` lanes takes one (query, key);
    // masked pairs get S' = -inf. Groups without a pair still join the shuffles.
    for (int base = warp * pairs_per_warp; base < nq * kn; base += num_warps * pairs_per_warp) {
      const int pair = base + pair_slot;
      const bool used = pair < nq * kn;
      const int qi = used ? pair / kn : 0;
      const int kk = used ? pair % kn : 0;
      const int key = k0 + kk;
      const int lo = Lo(pos0 + qi, p.window);
      const bool visible = used && key >= lo && key <= pos0 + qi;
      float s[kMaxHeadsPerLane];
      const int pbase = part0 + (qi * KT + kk) * nvec;
      DCF_UNROLL
      for (int j = 0; j < kMaxHeadsPerLane; ++j) {
        const int m = sub + width * j;
        s[j] = 0.0f;
        if (visible && m < N) {
          for (int g = 0; g < slots_per_head; ++g) s[j] += smem[pbase + m * slots_per_head + g];
        }
      }
      if (p.compose) {
        const KeyRow<CT> row =
            visible ? FindKeyRow<CT>(p, seq, start, tok0, key) : KeyRow<CT>{nullptr, -1};
        ComposeGroup(N, sub, width, smem, qt0 + qi * terms, KeyTerms<CT>(p, row, 0), s);
      }
      if (!used) continue;
      const int sbase = sc0 + (qi * KT + kk) * N;
      float* dst =
          p.scores + (tl0 + qi) * p.ld_scores + static_cast<int64_t>(visible ? key - lo : 0) * N;
      DCF_UNROLL
      for (int j = 0; j < kMaxHeadsPerLane; ++j) {
        const int m = sub + width * j;
        if (m < N) {
          smem[sbase + m] = visible ? s[j] : -INFINITY;
          if (visible) dst[m] = s[j];
        }
      }
    }
    __syncthreads();

    // C. Online max / sum per (query, head); each entry always has the same owner thread.
    for (int i = tid; i < nq * N; i += blockDim.x) {
      const int qi = i / N;
      const int n = i % N;
      float mx = smem[max0 + i];
      float sum = smem[sum0 + i];
      for (int kk = 0; kk < kn; ++kk) {
        const float x = smem[sc0 + (qi * KT + kk) * N + n];
        if (x == -INFINITY) continue;
        if (x > mx) {
          sum = sum * expf(mx - x) + 1.0f;
          mx = x;
        } else {
          sum += expf(x - mx);
        }
      }
      smem[max0 + i] = mx;
      smem[sum0 + i] = sum;
    }
    // The next tile's step A writes only `part`, read by step B before the barrier above;
    // its step B rewrites `sc` only after the barrier that follows step A.
  }

  for (int i = tid; i < nq * N; i += blockDim.x) {
    const int qi = i / N;
    const int n = i % N;
    const int64_t at = (static_cast<int64_t>(tl0 + qi) * p.max_splits + split) * N + n;
    p.stat_max[at] = smem[max0 + i];
    p.stat_sum[at] = smem[sum0 + i];
  }
}

// One instantiation of the pass, for DispatchPass (dcmha_device.cuh).
template <typename CT, int VEC, int QB>
struct ScoresPass {
  static cudaError_t Launch(const Params& p, int num_groups, cudaStream_t stream) {
    const size_t smem = sizeof(float) * ScoresSmemFloats(QB, p.nvec, p.n_head);
    const cudaError_t e = AllowDynamicSmem(DcmhaScoresKernel<CT, VEC, QB>, smem);
    if (e != cudaSuccess) return e;
    const dim3 grid(p.max_splits, num_groups);
    DCF_LAUNCH((DcmhaScoresKernel<CT, VEC, QB>), grid, ThreadsFor(p.nvec), smem, stream, p);
    return cudaGetLastError();
  }
};

}  // namespace

cudaError_t LaunchScores(const Params& p, ElemType cache_dtype, int qb, int num_groups,
                         cudaStream_t stream) {
  return DispatchPass<ScoresPass>(p, cache_dtype, qb, num_groups, stream);
}

}  // namespace dcmha
}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
