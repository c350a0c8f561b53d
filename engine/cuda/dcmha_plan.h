// How LaunchDcmha cuts one layer's attention into kernel launches (dcmha_attention.cu), and the
// parameters its kernels (dcmha_scores.cu, dcmha_output.cu) share. Internal to the DCMHA
// kernels: the backend uses dcmha_attention.h only.
//
// Work units. A *group* is up to QB consecutive new tokens of one sequence that one thread
// block serves together (they share the loads of every key row): QB = 1 for the tokens of
// single-token sequences (decode), QB = kChunkQueries for prefill chunks. The keys a group
// needs are the union of its queries' visible ranges, [Lo(first position), last position];
// a *split* is a run of at most split_keys of them, one thread block per (split, group).
//
// Passes (DESIGN.md, "DCMHA on a GPU"): compose mixes the heads' scores at one (query, key),
// and post-compose mixes the heads' *normalised* probabilities, so one online-softmax pass does
// not work.
//   1. DcmhaScores (split, group): S = q.k / sqrt(hd) for all heads, pre-compose -> S'
//      [token][key][N] f32 in the workspace; per (token, split, head) max m and sum of
//      exp(S' - m).
//   2. DcmhaOutput (split, group): combines the splits' (m, sum) into the softmax statistics,
//      P = exp(S' - M) / Z, post-compose P', partial O = sum_key P' V per split; one split
//      writes `out` directly, several write f32 partial rows.
//   3. DcmhaSplitReduce (token): out = sum of the split partials (post-compose is linear and
//      nothing is renormalised, so the partials simply add).
// Storing S' costs N floats written and read per (query, key) against re-reading N * hd K
// elements and redoing the dot products (N = 32, hd = 80: 256 bytes against 5120 in bf16).
//
// Decode steps (every sequence has one new token: no prefill chunk) take their own two
// kernels (dcmha_decode.cu), built for memory-level parallelism at batch 1:
//   1. DcmhaDecodeScores (split, token): as pass 1, over splits sized on the device per token
//      (SplitKeys: enough splits that the step's tokens fill kDecodeWaves waves of the SMs,
//      none smaller than kMinSplitBytes of K), KT keys per tile with every key's K slice in
//      registers before the first is used, the block table read once per cache block. The
//      last split of a token to finish (a counter) merges every split's (m, sum) into the
//      token's softmax statistics M and 1 / Z.
//   2. DcmhaDecodeOutput (split, head group, token): P = exp(S' - M) / Z and post-compose for
//      all heads at each key (compose mixes them), P' V only for the block's G heads, several
//      keys per thread in flight. The last split of a (token, head group) adds the splits'
//      partial rows in split order and writes `out`: the split reduction is inside pass 2.
// Both orders of summation are fixed (no float atomics), so results do not depend on which
// block finishes last.
//
// Waves. S' needs max_keys * N floats per token; LaunchDcmha runs the tokens of a step in
// waves of as many tokens as the workspace holds (a decode step is one wave when the
// workspace was sized by DcmhaWorkspaceBytes for max_seqs).
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/simt/cuda_compat.h"
#include "engine/cuda/dcmha_attention.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace dcmha {

// Queries per prefill group (registers: QB * VEC q values and accumulators per thread).
inline constexpr int kChunkQueries = 8;
// Elements per vector slot of a row (16 bytes of bf16/f16, 32 of f32) where hd and the row
// length are multiples of it; else 1. Thread v owns slot v, and blocks have at most
// kMaxThreads threads (so the compiler may give a thread 128 registers): N * hd <= 4096.
inline constexpr int kVec = 8;
inline constexpr int kMaxThreads = 512;
// Fewest keys per split, and the largest (token, split) count a wave spreads over (the
// size of the partial-output area). Splits are only made while blocks are too few to fill
// the device: target blocks = kBlocksPerSm * SMs. Not measured on a GPU yet.
inline constexpr int kMinSplitKeys = 32;
inline constexpr int kMaxSplitRows = 1024;
inline constexpr int kBlocksPerSm = 4;
// Workspace for composed scores that DcmhaWorkspaceBytes aims at when max_seqs tokens need
// less (prefill waves).
inline constexpr size_t kScoreBudgetBytes = size_t{64} << 20;
// Heads one lane of a warp holds in compose (N <= 32 * this).
inline constexpr int kMaxHeadsPerLane = 8;
// Partial dot products of one key tile in shared memory (floats) in DcmhaScores.
inline constexpr int kPartFloats = 10240;
// Keys per tile of DcmhaOutput.
inline constexpr int kOutputTileKeys = 16;
// Largest dynamic shared memory a kernel asks for (fits sm_80 and sm_90 with the opt-in).
inline constexpr int kMaxSmemBytes = 96 * 1024;

// The visible keys of query position `pos`: [Lo(pos), pos].
__host__ __device__ inline int Lo(int pos, int window) {
  return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
}

// Everything the attention kernels of one wave read. Device pointers; POD, passed by value.
struct Params {
  // Step structure (StepView).
  const int32_t* positions;    // [T]
  const int32_t* seq_offsets;  // [S + 1]
  const int32_t* token_seq;    // [T]
  int blocks_per_seq;
  // Layer.
  int n_head;    // N
  int head_dim;  // hd
  int window;    // 0 = global
  bool compose;
  float scale;  // 1 / sqrt(hd)
  // Fresh f32 inputs.
  const float* qkv;  // [T, 3 * N * hd] at qkv_stride
  int64_t qkv_stride;
  const float* dyn;  // [T, C, 2I, N] at dyn_stride
  int64_t dyn_stride;
  const float* gates;  // [T, C, N] at gates_stride
  int64_t gates_stride;
  bool fresh_vec_ok;  // qkv and qkv_stride allow 16-byte loads
  // Cache (one layer of one group).
  const void* cache;     // [num_blocks][layers_in_group][block_size][row_elems]
  int64_t layer_offset;  // layer_in_group * block_size * row_elems (elements)
  int64_t block_elems;   // layers_in_group * block_size * row_elems
  int block_size;
  int row_elems;
  int num_blocks;
  const int32_t* block_table;  // [S, blocks_per_seq]
  // Output.
  void* out;  // [T, N * hd] of out_dtype
  ElemType out_dtype;
  // The wave: tokens [tw0, tw1).
  int tw0;
  int tw1;
  int split_keys;     // keys per split
  int max_splits;     // splits per token in the workspace layout (>= the splits any group uses)
  int64_t ld_scores;  // floats of S' per token: max visible keys * N
  // Workspace areas (device pointers into args.workspace).
  float* scores;    // [TW][max visible keys][N]   S' (key index = position - Lo(pos))
  float* stat_max;  // [TW][max_splits][N]
  float* stat_sum;  // [TW][max_splits][N]
  float* partial;   // [TW * max_splits][N * hd]   only when max_splits > 1
  int32_t* splits;  // [TW] splits of each token's group (written by pass 1)
  // The launch's groups (blockIdx.y): null = the wave's tokens one by one, else a list
  // [count, (t0, n) * count] written by DcmhaBuildGroups.
  const int32_t* groups;
  // Kernel geometry.
  int vec;   // elements per vector slot: kVec or 1
  int nvec;  // N * hd / vec

  // Decode path only (dcmha_decode.cu); the token is blockIdx.y (pass 1) / blockIdx.z (pass 2)
  // and scores/stat_max/stat_sum are indexed by step token.
  int split_target;     // pass 1: splits wanted per token (SplitKeys)
  int min_split_keys;   // pass 1: fewest keys per split
  int split_target2;    // pass 2: splits wanted per (token, head group)
  int min_split_keys2;  // pass 2: fewest keys per split
  int max_splits2;      // pass 2: grid.x and the partial layout's splits per (token, group)
  int group_heads;      // G: heads whose P'V one pass-2 block accumulates
  int num_head_groups;  // N / G
  float* final_max;     // [T][N] softmax max M of each (token, head)
  float* final_inv;     // [T][N] 1 / Z
  float* partial2;      // [T][num_head_groups][max_splits2][G * hd] pass-2 partial rows
  int32_t* counters;    // [T] pass 1 then [T][num_head_groups] pass 2: splits done; the last
                        // one resets its counter to 0 (DcmhaInitWorkspace zeroes them once)
};

// ---------------------------------------------------------------------------------------
// Decode path (dcmha_decode.cu).

// Waves of the SMs a decode step's blocks aim at, per pass.
inline constexpr int kDecodeWaves = 2;
// Fewest bytes of K (pass 1) or of one head group's V (pass 2) a split reads.
inline constexpr int kMinSplitBytes = 4096;
// Keys per tile: pass 1 keeps each key's K slice in registers (KT * VEC floats per thread),
// pass 2 composes a tile's probabilities at once.
inline constexpr int kDecodeScoreTile = 8;
inline constexpr int kDecodeOutputTile = 16;
// Largest vector slots of one pass-2 head group (G * hd / vec), and the block size of pass 2.
inline constexpr int kGroupSlots = 64;
inline constexpr int kDecodeOutputThreads = 128;
// Counters at the start of the workspace (ints): tokens * (1 + head groups) must fit.
inline constexpr int kDecodeCounters = 16384;
inline constexpr size_t kCounterBytes = sizeof(int32_t) * kDecodeCounters;

// Keys per split of a token that sees `keys` keys: as many splits as `target` (or more, up
// to 2 * target - 1), none below `min_keys`.
__host__ __device__ inline int SplitKeys(int keys, int target, int min_keys) {
  const int k = keys / (target > 0 ? target : 1);
  return k > min_keys ? k : (min_keys > 0 ? min_keys : 1);
}
__host__ __device__ inline int NumSplits(int keys, int split_keys) {
  return (keys + split_keys - 1) / split_keys;
}
// Split `split` of the token at `pos` (window as Lo takes it): its keys [begin, end) of the
// token's visible keys from `lo`, and how many splits the token has (`split` >= count: none).
struct DecodeSplit {
  int lo, count, begin, end;
};
__host__ __device__ inline DecodeSplit SplitOfToken(int pos, int window, int target,
                                                    int min_keys, int split) {
  DecodeSplit d;
  d.lo = Lo(pos, window);
  const int keys = pos + 1 - d.lo;
  const int split_keys = SplitKeys(keys, target, min_keys);
  d.count = NumSplits(keys, split_keys);
  d.begin = d.lo + split * split_keys;
  d.end = d.begin + split_keys < pos + 1 ? d.begin + split_keys : pos + 1;
  return d;
}
// The most splits SplitKeys gives any token with 1..max_keys keys (the grid's x).
inline int MaxSplits(int max_keys, int target, int min_keys) {
  const int by_min = (max_keys + min_keys - 1) / min_keys;
  const int by_target = 2 * target - 1;
  const int m = by_min < by_target ? by_min : by_target;
  return m > 1 ? m : 1;
}

// Heads per pass-2 head group: the largest divisor G of N with G * hd / vec <= kGroupSlots
// (1 when one head alone has more slots).
inline int DecodeGroupHeads(int n_head, int head_dim, int vec) {
  const int slots_per_head = head_dim / vec;
  int best = 1;
  for (int g = 1; g <= n_head; ++g) {
    if (n_head % g == 0 && g * slots_per_head <= kGroupSlots) best = g;
  }
  return best;
}
// Threads of a pass-2 block for G heads: kDecodeOutputThreads, or more for a head group
// with more slots (one thread per slot at least).
inline int DecodeOutputThreads(int group_slots) {
  const int t = (group_slots + 31) / 32 * 32;
  return t > kDecodeOutputThreads ? t : kDecodeOutputThreads;
}
inline int DecodeScoresSmemFloats(int nvec, int n_head) {
  return kDecodeScoreTile * (nvec + n_head) + (2 * kRank + 1) * n_head + 2 * n_head;
}
inline int DecodeOutputSmemFloats(int n_head, int group_heads, int group_slots, int vec,
                                  int threads) {
  const int key_lanes = threads / group_slots;
  const int red = key_lanes * group_slots * vec;
  const int tile = kDecodeOutputTile * group_heads;
  return 2 * n_head + (2 * kRank + 1) * n_head + (tile > red ? tile : red);
}

cudaError_t LaunchDecodeScores(const Params& p, ElemType cache_dtype, int num_tokens,
                               cudaStream_t stream);
cudaError_t LaunchDecodeOutput(const Params& p, ElemType cache_dtype, int num_tokens,
                               cudaStream_t stream);

// Launches pass 1 or 2 for groups of up to `qb` tokens (1 or kChunkQueries) over
// `num_groups` slots of p.groups (blockIdx.y) and p.max_splits splits (blockIdx.x); slots
// beyond the list's count exit at once.
cudaError_t LaunchScores(const Params& p, ElemType cache_dtype, int qb, int num_groups,
                         cudaStream_t stream);
cudaError_t LaunchOutput(const Params& p, ElemType cache_dtype, int qb, int num_groups,
                         cudaStream_t stream);
cudaError_t LaunchSplitReduce(const Params& p, cudaStream_t stream);

// Keys per tile of DcmhaScores (its partial dot products fill kPartFloats) and of
// DcmhaOutput (its probability tile stays near 16 KiB).
__host__ __device__ inline int ScoresKeyTile(int qb, int nvec) {
  const int kt = kPartFloats / (qb * nvec);
  return kt < 1 ? 1 : kt > 16 ? 16 : kt;
}
__host__ __device__ inline int OutputKeyTile(int qb, int n_head) {
  const int kt = 4096 / (qb * n_head);
  return kt < 1 ? 1 : kt > kOutputTileKeys ? kOutputTileKeys : kt;
}

// Dynamic shared memory (floats) of the two passes.
inline int ScoresSmemFloats(int qb, int nvec, int n_head) {
  const int kt = ScoresKeyTile(qb, nvec);
  return qb * kt * (nvec + n_head) + qb * (2 * kRank + 1) * n_head + 2 * qb * n_head;
}
inline int OutputSmemFloats(int qb, int n_head) {
  return 2 * qb * n_head + qb * (2 * kRank + 1) * n_head + qb * OutputKeyTile(qb, n_head) * n_head;
}

// Threads per block of the attention kernels for N * hd / vec vector slots (one per thread).
inline int ThreadsFor(int nvec) {
  const int t = (nvec + 31) / 32 * 32;
  return t < 128 ? 128 : t;
}

}  // namespace dcmha
}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
