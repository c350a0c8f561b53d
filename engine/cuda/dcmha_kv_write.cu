// LaunchKvCacheWrite (dcmha_attention.h): the new rows of a step into the paged cache.
//
// Grid: one block per new token, 128 threads striding over the row (K | V | pre-key terms
// | post-key terms, KvRowLayout), each element converted from the f32 inputs to the cache
// dtype. A token whose block-table entry is missing (-1: a window position no block keeps)
// writes nothing.
#include "engine/simt/cuda_compat.h"
#include "engine/cuda/dcmha_attention.h"
#include "engine/cuda/dcmha_device.cuh"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace {

struct KvWriteParams {
  const int32_t* positions;
  const int32_t* token_seq;
  int blocks_per_seq;
  int n_head;
  int head_dim;
  const float* qkv;
  int64_t qkv_stride;
  const float* dyn;
  int64_t dyn_stride;
  const float* gates;
  int64_t gates_stride;
  void* cache;
  int64_t layer_offset;
  int64_t block_elems;
  int block_size;
  int row_elems;
  int num_blocks;
  const int32_t* block_table;
};

template <typename CT>
__global__ void KvCacheWriteKernel(KvWriteParams p) {
  const int t = blockIdx.x;
  const int seq = p.token_seq[t];
  const int pos = p.positions[t];
  const int blk = p.block_table[static_cast<int64_t>(seq) * p.blocks_per_seq + pos / p.block_size];
  if (blk < 0 || blk >= p.num_blocks) return;
  CT* row = static_cast<CT*>(p.cache) + blk * p.block_elems + p.layer_offset +
            static_cast<int64_t>(pos % p.block_size) * p.row_elems;
  const int N = p.n_head;
  const int nhd = N * p.head_dim;
  const int branch = (2 * kRank + 1) * N;  // floats of one key-side branch
  const float* kv = p.qkv + t * p.qkv_stride + nhd;
  const float* dyn = p.dyn + t * p.dyn_stride;
  const float* gates = p.gates + t * p.gates_stride;
  for (int e = threadIdx.x; e < p.row_elems; e += blockDim.x) {
    float x;
    if (e < 2 * nhd) {
      x = kv[e];
    } else {
      const int b = (e - 2 * nhd) / branch;  // 0: pre-key (model branch 1), 1: post-key (3)
      const int w = (e - 2 * nhd) % branch;
      const int c = 2 * b + 1;
      x = w < 2 * kRank * N ? dyn[c * 2 * kRank * N + w] : gates[c * N + (w - 2 * kRank * N)];
    }
    row[e] = dcmha::FromFloat<CT>(x);
  }
}

}  // namespace

cudaError_t LaunchKvCacheWrite(const StepView& step, const DcmhaLayerArgs& args,
                               cudaStream_t stream) {
  const CacheView& c = args.cache;
  if (args.n_head <= 0 || args.head_dim <= 0 || args.window < 0 || c.block_size <= 0 ||
      c.layers_in_group <= 0 || args.layer_in_group < 0 ||
      args.layer_in_group >= c.layers_in_group ||
      c.row_elems != 2 * args.n_head * args.head_dim + 2 * (2 * kRank + 1) * args.n_head) {
    return cudaErrorInvalidValue;
  }
  if (step.num_tokens == 0) return cudaSuccess;
  KvWriteParams p{};
  p.positions = step.positions;
  p.token_seq = step.token_seq;
  p.blocks_per_seq = step.blocks_per_seq;
  p.n_head = args.n_head;
  p.head_dim = args.head_dim;
  p.qkv = args.qkv;
  p.qkv_stride = args.qkv_stride;
  p.dyn = args.dyn;
  p.dyn_stride = args.dyn_stride;
  p.gates = args.gates;
  p.gates_stride = args.gates_stride;
  p.cache = c.base;
  p.layer_offset = static_cast<int64_t>(args.layer_in_group) * c.block_size * c.row_elems;
  p.block_elems = static_cast<int64_t>(c.layers_in_group) * c.block_size * c.row_elems;
  p.block_size = c.block_size;
  p.row_elems = c.row_elems;
  p.num_blocks = c.num_blocks;
  p.block_table = c.block_table;
  constexpr int kThreads = 128;
  switch (c.dtype) {
    case ElemType::kF32:
      DCF_LAUNCH(KvCacheWriteKernel<float>, step.num_tokens, kThreads, 0, stream, p);
      break;
    case ElemType::kBF16:
      DCF_LAUNCH(KvCacheWriteKernel<__nv_bfloat16>, step.num_tokens, kThreads, 0, stream, p);
      break;
    case ElemType::kF16:
      DCF_LAUNCH(KvCacheWriteKernel<__half>, step.num_tokens, kThreads, 0, stream, p);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
