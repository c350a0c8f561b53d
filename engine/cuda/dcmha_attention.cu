// LaunchDcmha and DcmhaWorkspaceBytes (dcmha_attention.h): the workspace layout, the waves,
// the split choice and the group lists; the passes themselves are in dcmha_scores.cu and
// dcmha_output.cu (dcmha_plan.h explains the scheme).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "engine/simt/cuda_compat.h"
#include "engine/cuda/dcmha_attention.h"
#include "engine/cuda/dcmha_device.cuh"
#include "engine/cuda/dcmha_plan.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace {

using dcmha::kChunkQueries;

constexpr size_t kAlign = 256;
size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Byte offsets of the workspace areas for waves of up to `tw` tokens that see up to `keys`
// keys each.
struct Layout {
  size_t scores = 0, stat_max = 0, stat_sum = 0, partial = 0, splits = 0, singles = 0, chunks = 0,
         total = 0;
  int64_t partial_rows = 0;
};

// Both layouts start after the decode kernels' counters (dcmha::kCounterBytes), which no
// other area overlaps.
Layout MakeLayout(int n_head, int head_dim, int64_t tw, int64_t keys) {
  Layout l;
  const int64_t stat_rows = std::max<int64_t>(tw, dcmha::kMaxSplitRows);
  const int64_t splits_possible = CeilDiv(keys + kChunkQueries - 1, dcmha::kMinSplitKeys);
  l.partial_rows =
      splits_possible > 1 ? std::min<int64_t>(dcmha::kMaxSplitRows, tw * splits_possible) : 0;
  size_t at = dcmha::kCounterBytes;
  auto take = [&at](size_t bytes) {
    const size_t here = at;
    at += AlignUp(bytes);
    return here;
  };
  l.scores = take(sizeof(float) * tw * keys * n_head);
  l.stat_max = take(sizeof(float) * stat_rows * n_head);
  l.stat_sum = take(sizeof(float) * stat_rows * n_head);
  l.partial = take(sizeof(float) * l.partial_rows * n_head * head_dim);
  l.splits = take(sizeof(int32_t) * tw);
  l.singles = take(sizeof(int32_t) * (1 + 2 * tw));
  l.chunks = take(sizeof(int32_t) * (1 + 2 * tw));  // runs of >= 1 token: at most tw
  l.total = at;
  return l;
}

// How the decode kernels split a step of `tokens` decode tokens that see up to `keys` keys
// (dcmha_plan.h, "Decode steps"), and where their workspace areas lie.
struct DecodePlan {
  int split_target = 1, min_split_keys = 1, max_splits = 1;
  int split_target2 = 1, min_split_keys2 = 1, max_splits2 = 1;
  int group_heads = 1, num_head_groups = 1;
  size_t scores = 0, stat_max = 0, stat_sum = 0, final_max = 0, final_inv = 0, partial2 = 0,
         total = 0;
};

DecodePlan MakeDecodePlan(int n_head, int head_dim, int vec, int elem_bytes, int64_t tokens,
                          int64_t keys, int sms) {
  DecodePlan d;
  const int64_t target = static_cast<int64_t>(dcmha::kDecodeWaves) * std::max(sms, 1);
  const int64_t row_bytes = static_cast<int64_t>(n_head) * head_dim * elem_bytes;
  d.split_target = static_cast<int>(CeilDiv(target, tokens));
  d.min_split_keys = static_cast<int>(std::max<int64_t>(1, CeilDiv(dcmha::kMinSplitBytes, row_bytes)));
  d.max_splits = dcmha::MaxSplits(static_cast<int>(keys), d.split_target, d.min_split_keys);
  d.group_heads = dcmha::DecodeGroupHeads(n_head, head_dim, vec);
  d.num_head_groups = n_head / d.group_heads;
  const int64_t group_bytes = static_cast<int64_t>(d.group_heads) * head_dim * elem_bytes;
  d.split_target2 = static_cast<int>(CeilDiv(target, tokens * d.num_head_groups));
  d.min_split_keys2 =
      static_cast<int>(std::max<int64_t>(1, CeilDiv(dcmha::kMinSplitBytes, group_bytes)));
  d.max_splits2 = dcmha::MaxSplits(static_cast<int>(keys), d.split_target2, d.min_split_keys2);
  size_t at = dcmha::kCounterBytes;
  auto take = [&at](size_t bytes) {
    const size_t here = at;
    at += AlignUp(bytes);
    return here;
  };
  d.scores = take(sizeof(float) * tokens * keys * n_head);
  d.stat_max = take(sizeof(float) * tokens * d.max_splits * n_head);
  d.stat_sum = take(sizeof(float) * tokens * d.max_splits * n_head);
  d.final_max = take(sizeof(float) * tokens * n_head);
  d.final_inv = take(sizeof(float) * tokens * n_head);
  d.partial2 = take(sizeof(float) * tokens * d.max_splits2 * n_head * head_dim);
  d.total = at;
  return d;
}

// Whether a decode step of `tokens` tokens can take the decode kernels at all.
bool DecodeFits(const DecodePlan& d, int64_t tokens) {
  return tokens <= 65535 && tokens * (1 + d.num_head_groups) <= dcmha::kDecodeCounters &&
         d.max_splits2 <= 65535;
}

// Streaming multiprocessors of the current device (cached per device).
int SmCount() {
  static std::atomic<int> cache[16] = {};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0) device = 0;
  std::atomic<int>& slot = cache[device < 16 ? device : 15];
  int n = slot.load(std::memory_order_relaxed);
  if (n == 0) {
    cudaDeviceProp prop{};
    n = cudaGetDeviceProperties(&prop, device) == cudaSuccess && prop.multiProcessorCount > 0
            ? prop.multiProcessorCount
            : 1;
    slot.store(n, std::memory_order_relaxed);
  }
  return n;
}

// Exclusive prefix sum of v over the block (blockDim.x a multiple of 32, <= 1024); `total`
// gets the block's sum. All threads call it.
template <typename Smem>
__device__ int BlockExclusiveScan(int v, int& total, Smem& warp_sums) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int num_warps = blockDim.x / 32;
  int x = v;
  for (int d = 1; d < 32; d *= 2) {
    const int y = __shfl_up_sync(dcmha::kFullMask, x, d);
    if (lane >= d) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  int before = 0;
  total = 0;
  for (int w = 0; w < num_warps; ++w) {
    const int s = warp_sums[w];
    if (w < warp) before += s;
    total += s;
  }
  __syncthreads();  // warp_sums is reused by the next call
  return before + x - v;
}

// Lists the groups of the wave's tokens: the tokens of single-token sequences (decode) into
// `singles`, the other sequences' tokens in runs of up to `chunk_qb` into `chunks`; both as
// [count, (t0, n) * count]. One block.
__global__ void __launch_bounds__(256)
    DcmhaBuildGroupsKernel(dcmha::Params p, int chunk_qb, int32_t* singles, int32_t* chunks) {
  DCF_SHARED(int, warp_sums, 32);
  const int first_seq = p.token_seq[p.tw0];
  const int last_seq = p.token_seq[p.tw1 - 1];
  int num_singles = 0, num_chunks = 0;  // the same in every thread
  for (int base = first_seq; base <= last_seq; base += blockDim.x) {
    const int s = base + threadIdx.x;
    int lo = 0, hi = 0, is_single = 0, groups = 0;
    if (s <= last_seq) {
      const int off0 = p.seq_offsets[s];
      const int off1 = p.seq_offsets[s + 1];
      lo = max(off0, p.tw0);
      hi = min(off1, p.tw1);
      if (hi > lo) {
        if (off1 - off0 == 1) {
          is_single = 1;
        } else {
          groups = (hi - lo + chunk_qb - 1) / chunk_qb;
        }
      }
    }
    int total_singles = 0, total_groups = 0;
    const int at_single = BlockExclusiveScan(is_single, total_singles, warp_sums);
    const int at_group = BlockExclusiveScan(groups, total_groups, warp_sums);
    if (is_single) {
      singles[1 + 2 * (num_singles + at_single)] = lo;
      singles[2 + 2 * (num_singles + at_single)] = 1;
    }
    for (int g = 0; g < groups; ++g) {
      const int i = num_chunks + at_group + g;
      chunks[1 + 2 * i] = lo + g * chunk_qb;
      chunks[2 + 2 * i] = min(chunk_qb, hi - lo - g * chunk_qb);
    }
    num_singles += total_singles;
    num_chunks += total_groups;
  }
  if (threadIdx.x == 0) {
    singles[0] = num_singles;
    chunks[0] = num_chunks;
  }
}

// Dynamic shared memory (floats) of the attention kernels for a step with or without
// prefill chunks.
size_t AttentionSmemFloats(int nvec, int n_head, bool has_chunks) {
  return std::max({dcmha::ScoresSmemFloats(1, nvec, n_head), dcmha::OutputSmemFloats(1, n_head),
                   has_chunks ? dcmha::ScoresSmemFloats(kChunkQueries, nvec, n_head) : 0,
                   has_chunks ? dcmha::OutputSmemFloats(kChunkQueries, n_head) : 0});
}

}  // namespace

bool DcmhaShapeSupported(int n_head, int head_dim) {
  if (n_head <= 0 || head_dim <= 0 || n_head > 256) return false;
  const int row_elems = 2 * n_head * head_dim + 2 * (2 * kRank + 1) * n_head;
  // The cache pools come from cudaMalloc (256-byte aligned): vector loads whenever the
  // shapes allow them, as in LaunchDcmha.
  const int vec = head_dim % dcmha::kVec == 0 && row_elems % dcmha::kVec == 0 ? dcmha::kVec : 1;
  const int nvec = n_head * head_dim / vec;
  return dcmha::ThreadsFor(nvec) <= dcmha::kMaxThreads &&
         AttentionSmemFloats(nvec, n_head, true) * sizeof(float) <=
             static_cast<size_t>(dcmha::kMaxSmemBytes);
}

size_t DcmhaWorkspaceBytes(int n_head, int head_dim, int max_tokens, int max_seqs, int max_keys) {
  n_head = std::max(n_head, 1);
  head_dim = std::max(head_dim, 1);
  const int64_t keys = std::max(max_keys, 1);
  const int64_t per_token = static_cast<int64_t>(sizeof(float)) * keys * n_head;
  int64_t tw = std::max<int64_t>(max_seqs, dcmha::kScoreBudgetBytes / per_token);
  tw = std::max<int64_t>(1, std::min<int64_t>(tw, std::max(max_tokens, 1)));
  size_t bytes = MakeLayout(n_head, head_dim, tw, keys).total;
  // Decode steps of up to max_seqs tokens, for any cache dtype and vector width.
  const int sms = SmCount();
  const int64_t decode_tokens = std::min(std::max(max_seqs, 1), std::max(max_tokens, 1));
  for (int64_t t = 1; t <= decode_tokens; ++t) {
    for (int vec : {1, dcmha::kVec}) {
      if (head_dim % vec != 0) continue;
      for (int elem : {2, 4}) {
        const DecodePlan d = MakeDecodePlan(n_head, head_dim, vec, elem, t, keys, sms);
        if (DecodeFits(d, t)) bytes = std::max(bytes, d.total);
      }
    }
  }
  return bytes;
}

DcmhaDecodeGrids DescribeDcmhaDecode(int n_head, int head_dim, ElemType cache_dtype,
                                     int num_tokens, int max_keys) {
  DcmhaDecodeGrids g;
  if (n_head <= 0 || head_dim <= 0 || num_tokens <= 0 || max_keys <= 0) return g;
  const int row_elems = 2 * n_head * head_dim + 2 * (2 * kRank + 1) * n_head;
  const int vec = head_dim % dcmha::kVec == 0 && row_elems % dcmha::kVec == 0 ? dcmha::kVec : 1;
  const DecodePlan d = MakeDecodePlan(n_head, head_dim, vec, ElemBytes(cache_dtype), num_tokens,
                                      max_keys, SmCount());
  if (!DecodeFits(d, num_tokens)) return g;
  g.scores_blocks = d.max_splits * num_tokens;
  g.output_blocks = d.max_splits2 * d.num_head_groups * num_tokens;
  g.head_groups = d.num_head_groups;
  g.scores_busy = dcmha::NumSplits(max_keys, dcmha::SplitKeys(max_keys, d.split_target,
                                                               d.min_split_keys)) *
                  num_tokens;
  g.output_busy = dcmha::NumSplits(max_keys, dcmha::SplitKeys(max_keys, d.split_target2,
                                                               d.min_split_keys2)) *
                  d.num_head_groups * num_tokens;
  return g;
}

cudaError_t DcmhaInitWorkspace(void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (workspace == nullptr || workspace_bytes < dcmha::kCounterBytes) return cudaErrorInvalidValue;
  return cudaMemsetAsync(workspace, 0, dcmha::kCounterBytes, stream);
}

cudaError_t LaunchDcmha(const StepView& step, const DcmhaLayerArgs& args, cudaStream_t stream) {
  const CacheView& c = args.cache;
  const int N = args.n_head;
  const int hd = args.head_dim;
  if (N <= 0 || N > 32 * dcmha::kMaxHeadsPerLane || hd <= 0 || args.window < 0 ||
      c.block_size <= 0 || c.layers_in_group <= 0 || args.layer_in_group < 0 ||
      args.layer_in_group >= c.layers_in_group ||
      c.row_elems != 2 * N * hd + 2 * (2 * kRank + 1) * N || args.workspace == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (step.num_tokens <= 0) return cudaSuccess;
  if (c.dtype != ElemType::kF32 && c.dtype != ElemType::kBF16 && c.dtype != ElemType::kF16) {
    return cudaErrorInvalidValue;
  }

  // Vector slots of kVec elements where heads, rows and the base allow (16-byte loads).
  const int vec = hd % dcmha::kVec == 0 && c.row_elems % dcmha::kVec == 0 &&
                          reinterpret_cast<uintptr_t>(c.base) % 16 == 0
                      ? dcmha::kVec
                      : 1;
  const int nvec = N * hd / vec;
  if (dcmha::ThreadsFor(nvec) > dcmha::kMaxThreads) return cudaErrorInvalidValue;
  const bool has_chunks = step.max_seq_tokens > 1;
  const int chunk_qb = kChunkQueries;
  const int max_qb = has_chunks ? chunk_qb : 1;
  const size_t smem_floats = AttentionSmemFloats(nvec, N, has_chunks);
  if (smem_floats * sizeof(float) > static_cast<size_t>(dcmha::kMaxSmemBytes)) {
    return cudaErrorInvalidValue;
  }

  // The most keys a token of this step sees, and the largest wave the workspace holds.
  const int64_t keys = args.window > 0 ? std::min<int64_t>(args.window, step.max_position + 1)
                                       : static_cast<int64_t>(step.max_position) + 1;
  const int T = step.num_tokens;
  if (MakeLayout(N, hd, 1, keys).total > args.workspace_bytes) return cudaErrorInvalidValue;
  int64_t lo = 1, hi = T;  // largest tw with MakeLayout(tw).total <= workspace_bytes
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (MakeLayout(N, hd, mid, keys).total <= args.workspace_bytes) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int64_t tw = std::min<int64_t>(lo, 65535 / 2);  // grid.y bound of the chunk groups
  const Layout layout = MakeLayout(N, hd, tw, keys);
  char* ws = static_cast<char*>(args.workspace);

  dcmha::Params p{};
  p.positions = step.positions;
  p.seq_offsets = step.seq_offsets;
  p.token_seq = step.token_seq;
  p.blocks_per_seq = step.blocks_per_seq;
  p.n_head = N;
  p.head_dim = hd;
  p.window = args.window;
  p.compose = args.compose;
  p.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  p.qkv = args.qkv;
  p.qkv_stride = args.qkv_stride;
  p.dyn = args.dyn;
  p.dyn_stride = args.dyn_stride;
  p.gates = args.gates;
  p.gates_stride = args.gates_stride;
  p.fresh_vec_ok = vec == dcmha::kVec && reinterpret_cast<uintptr_t>(args.qkv) % 16 == 0 &&
                   args.qkv_stride % 4 == 0 && (N * hd) % 4 == 0;
  p.cache = c.base;
  p.layer_offset = static_cast<int64_t>(args.layer_in_group) * c.block_size * c.row_elems;
  p.block_elems = static_cast<int64_t>(c.layers_in_group) * c.block_size * c.row_elems;
  p.block_size = c.block_size;
  p.row_elems = c.row_elems;
  p.num_blocks = c.num_blocks;
  p.block_table = c.block_table;
  p.out = args.out;
  p.out_dtype = args.out_dtype;
  p.ld_scores = keys * N;
  p.scores = reinterpret_cast<float*>(ws + layout.scores);
  p.stat_max = reinterpret_cast<float*>(ws + layout.stat_max);
  p.stat_sum = reinterpret_cast<float*>(ws + layout.stat_sum);
  p.partial = reinterpret_cast<float*>(ws + layout.partial);
  p.splits = reinterpret_cast<int32_t*>(ws + layout.splits);
  p.vec = vec;
  p.nvec = nvec;
  int32_t* singles = reinterpret_cast<int32_t*>(ws + layout.singles);  // [1 + 2 * tw]
  int32_t* chunks = reinterpret_cast<int32_t*>(ws + layout.chunks);    // [1 + 2 * tw]

  if (!has_chunks && args.split_decode) {
    // Decode step: the decode kernels, when the workspace holds their layout.
    const DecodePlan d = MakeDecodePlan(N, hd, vec, ElemBytes(c.dtype), T, keys, SmCount());
    if (DecodeFits(d, T) && d.total <= args.workspace_bytes) {
      dcmha::Params dp = p;
      dp.tw0 = 0;
      dp.tw1 = T;
      dp.groups = nullptr;
      dp.max_splits = d.max_splits;
      dp.split_target = d.split_target;
      dp.min_split_keys = d.min_split_keys;
      dp.split_target2 = d.split_target2;
      dp.min_split_keys2 = d.min_split_keys2;
      dp.max_splits2 = d.max_splits2;
      dp.group_heads = d.group_heads;
      dp.num_head_groups = d.num_head_groups;
      dp.scores = reinterpret_cast<float*>(ws + d.scores);
      dp.stat_max = reinterpret_cast<float*>(ws + d.stat_max);
      dp.stat_sum = reinterpret_cast<float*>(ws + d.stat_sum);
      dp.final_max = reinterpret_cast<float*>(ws + d.final_max);
      dp.final_inv = reinterpret_cast<float*>(ws + d.final_inv);
      dp.partial2 = reinterpret_cast<float*>(ws + d.partial2);
      dp.counters = reinterpret_cast<int32_t*>(ws);
      cudaError_t e = dcmha::LaunchDecodeScores(dp, c.dtype, T, stream);
      if (e == cudaSuccess) e = dcmha::LaunchDecodeOutput(dp, c.dtype, T, stream);
      return e;
    }
  }

  const int target_blocks = std::min(dcmha::kMaxSplitRows, dcmha::kBlocksPerSm * SmCount());
  const int64_t group_keys = keys + max_qb - 1;  // keys of one group's union range
  for (int tw0 = 0; tw0 < T; tw0 += static_cast<int>(tw)) {
    const int tw1 = static_cast<int>(std::min<int64_t>(T, tw0 + tw));
    const int wave = tw1 - tw0;
    // Split the keys only while (token, split) blocks are fewer than the target.
    int64_t splits =
        std::min<int64_t>(target_blocks / wave, CeilDiv(group_keys, dcmha::kMinSplitKeys));
    splits = std::min<int64_t>(splits, layout.partial_rows / wave);
    if (splits < 1) splits = 1;
    p.tw0 = tw0;
    p.tw1 = tw1;
    p.split_keys = static_cast<int>(CeilDiv(group_keys, splits));
    p.max_splits = static_cast<int>(CeilDiv(group_keys, p.split_keys));

    cudaError_t e = cudaSuccess;
    if (!has_chunks) {  // decode only: every token is its own group
      p.groups = nullptr;
      e = dcmha::LaunchScores(p, c.dtype, 1, wave, stream);
      if (e == cudaSuccess) e = dcmha::LaunchOutput(p, c.dtype, 1, wave, stream);
    } else {
      DCF_LAUNCH(DcmhaBuildGroupsKernel, 1, 256, 0, stream, p, chunk_qb, singles, chunks);
      e = cudaGetLastError();
      const int single_slots = std::min(wave, step.num_seqs);
      // Groups are disjoint runs of tokens, at most one partial run per sequence.
      const int chunk_slots = static_cast<int>(
          std::min<int64_t>(wave, CeilDiv(wave, chunk_qb) + std::min(wave, step.num_seqs)));
      dcmha::Params ps = p, pc = p;
      ps.groups = singles;
      pc.groups = chunks;
      if (e == cudaSuccess) e = dcmha::LaunchScores(ps, c.dtype, 1, single_slots, stream);
      if (e == cudaSuccess) e = dcmha::LaunchScores(pc, c.dtype, chunk_qb, chunk_slots, stream);
      if (e == cudaSuccess) e = dcmha::LaunchOutput(ps, c.dtype, 1, single_slots, stream);
      if (e == cudaSuccess) e = dcmha::LaunchOutput(pc, c.dtype, chunk_qb, chunk_slots, stream);
    }
    if (e == cudaSuccess && p.max_splits > 1) e = dcmha::LaunchSplitReduce(p, stream);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
