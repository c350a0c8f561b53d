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
};

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
