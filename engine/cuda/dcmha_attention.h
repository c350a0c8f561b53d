// The contract between the CUDA backend's layer loop (cuda_backend_forward.cc) and its DCMHA
// kernels (paged KV-cache write and attention, dcmha_*.cu). Plain C++ plus cuda_compat.h, so
// the .cu kernels (nvcc, or host C++ on the SIMT emulator) and the host code both include it.
//
// Math: DCFORMER.md section 4 (compose, softmax per head over visible keys, post-compose on
// the normalised probabilities without renormalisation), section 5 (window: query t sees
// keys t - W < p <= t). The CPU op it must match is dcf::cpu::AttendOne (engine/cpu/dcmha.h).
//
// Window rule at this interface (engine/execution/step_batch.h): a sequence's new tokens are
// [start, end); after the step a window layer keeps only positions >= FirstKeptPosition(W,
// end) = max(0, end - W + 1). LaunchKvCacheWrite writes every new position whose block-table
// entry is present (the KV manager gives a window layer blocks for the kept positions, and
// with prefix caching for every new position), and LaunchDcmha takes keys p < start from
// the cache and keys p >= start from this step's fresh inputs (qkv/dyn/gates), never from
// the cache: positions of a long prefill chunk below the first kept position may have no
// window block. `start` is any position: a prefill that resumes after a prefix-cache hit
// reads the cached keys [FirstKeptPosition(W, start), start) like any later chunk.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/simt/cuda_compat.h"

namespace dcf::cuda {
// DCF_CUDA_NS (cuda_compat.h) is `sim` or `gpu`: one binary may link both builds.
inline namespace DCF_CUDA_NS {

// Element types of device buffers (the backend's --dtype, or f32 for fp32 buffers).
enum class ElemType : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

inline int ElemBytes(ElemType t) { return t == ElemType::kF32 ? 4 : 2; }

// DCMHA constants (ModelConfig::kComposeBranches, kRank): C branches in the order pre-query,
// pre-key, post-query, post-key; rank I.
inline constexpr int kBranches = 4;
inline constexpr int kRank = 2;

// The step's sequence structure, in device memory, shared by every layer of the step.
struct StepView {
  int num_tokens = 0;                // T
  int num_seqs = 0;                  // S
  const int32_t* positions = nullptr;    // [T] position of each new token
  const int32_t* seq_offsets = nullptr;  // [S + 1] tokens of sequence s: [off[s], off[s+1])
  const int32_t* token_seq = nullptr;    // [T] sequence of each token
  int blocks_per_seq = 0;            // block-table capacity (ceil(context / block_size))
  // Host-side bounds of this step, for grid sizes and workspace splits:
  int max_seq_tokens = 0;            // longest chunk (1 in a decode-only step)
  int max_position = 0;              // largest position of any token in the step
};

// One layer group's paged cache: [num_blocks][layers_in_group][block_size][row] elements of
// `dtype`, where a row (per token and layer) is engine/kv/kv_layout.h's KvRowLayout:
//   K [N * hd] | V [N * hd] | pre-key terms: W1 [I][N], W2 [I][N], G [N]
//                           | post-key terms: W1 [I][N], W2 [I][N], G [N]
// (row = 2 * N * hd + 10 * N elements). Position p of sequence s lives in physical block
// block_table[s * blocks_per_seq + p / block_size], slot p % block_size.
struct CacheView {
  void* base = nullptr;
  ElemType dtype = ElemType::kF32;
  int num_blocks = 0;
  int layers_in_group = 0;
  int block_size = 0;
  int row_elems = 0;
  const int32_t* block_table = nullptr;  // [S, blocks_per_seq] of this group, -1 = none
};

// One attention layer of one step.
struct DcmhaLayerArgs {
  int n_head = 0;          // N
  int head_dim = 0;        // hd
  int window = 0;          // W of a window layer; 0 for a global layer
  int layer_in_group = 0;  // which layer of the cache's group
  bool compose = true;     // false: plain multi-head attention (benchmarks only)

  // Fresh per-token inputs, f32, row t at base + t * stride (elements):
  const float* qkv = nullptr;  // [T, 3 * N * hd]: q | k | v, head-major; q and k already
  int64_t qkv_stride = 0;      //   qk-normed and rotated; q NOT scaled by 1/sqrt(hd)
  const float* dyn = nullptr;  // [T, C, 2I, N]: per branch c, W1 [I][N] (normalised over
  int64_t dyn_stride = 0;      //   heads) then W2 [I][N]
  const float* gates = nullptr;  // [T, C, N]: G = tanh(a . dd)
  int64_t gates_stride = 0;

  CacheView cache;
  void* out = nullptr;  // [T, N * hd] attention output (before Wo), of out_dtype
  ElemType out_dtype = ElemType::kF32;
  void* workspace = nullptr;  // DcmhaWorkspaceBytes bytes of device memory, DcmhaInitWorkspace'd
  size_t workspace_bytes = 0;
  // Decode steps (one new token per sequence) take the decode kernels (dcmha_plan.h); false:
  // the kernels of prefill steps, the plain path they replace (tests compare the two).
  bool split_decode = true;
};

// Device workspace LaunchDcmha needs for any step within these bounds (tokens and sequences
// per step, largest number of keys one query sees).
size_t DcmhaWorkspaceBytes(int n_head, int head_dim, int max_tokens, int max_seqs,
                           int max_keys);

// Zeroes the counters at the start of a new workspace (asynchronously on `stream`), once
// before its first LaunchDcmha: the decode kernels leave them zero after every launch.
// cudaErrorInvalidValue for a workspace smaller than DcmhaWorkspaceBytes can return.
cudaError_t DcmhaInitWorkspace(void* workspace, size_t workspace_bytes, cudaStream_t stream);

// Writes the new rows of every sequence into the blocks their tables name (see the window
// rule above), converting to the cache dtype (round to nearest even). A position without a
// block (block-table entry -1) is skipped. cudaErrorInvalidValue for inconsistent arguments
// (row_elems, layer_in_group); otherwise the launch's error.
cudaError_t LaunchKvCacheWrite(const StepView& step, const DcmhaLayerArgs& args,
                               cudaStream_t stream);

// out[t] = DCMHA of query t over its visible keys (cache + fresh), for every token of the
// step: decode tokens and prefill chunks alike. Asynchronous on `stream`; uses the workspace
// until the work is done. A step whose composed scores do not fit the workspace at once runs
// in several waves of tokens. Supported: N <= 256, N * hd <= 4096 (N * hd <= 512 where hd or
// row_elems is not a multiple of 8) within 96 KiB of shared memory per block;
// cudaErrorInvalidValue otherwise, and for a workspace smaller than one token's needs or
// inconsistent arguments. Kernel design: dcmha_plan.h.
cudaError_t LaunchDcmha(const StepView& step, const DcmhaLayerArgs& args, cudaStream_t stream);

// The grids LaunchDcmha gives a decode step of `num_tokens` tokens (one per sequence) that
// see up to `max_keys` keys, on the current device, with a cache from cudaMalloc: the blocks
// of its two decode kernels (dcmha_plan.h), or zeros where such a step takes the prefill
// kernels. For tests and benchmarks.
struct DcmhaDecodeGrids {
  int scores_blocks = 0;  // pass 1 grid: splits x tokens
  int output_blocks = 0;  // pass 2 grid: splits x head groups x tokens
  int head_groups = 0;
  // Of these, the blocks that do work when every token sees max_keys keys (the others exit).
  int scores_busy = 0;
  int output_busy = 0;
};
DcmhaDecodeGrids DescribeDcmhaDecode(int n_head, int head_dim, ElemType cache_dtype,
                                     int num_tokens, int max_keys);

// Whether LaunchDcmha supports a model with `n_head` heads of `head_dim` (the limits above,
// for a cache allocated with cudaMalloc and steps with prefill chunks): checked when a
// backend is created, so an unsupported model is refused at load instead of failing its
// first step.
bool DcmhaShapeSupported(int n_head, int head_dim);

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
