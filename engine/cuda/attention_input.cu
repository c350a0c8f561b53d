// LaunchAttentionInput (attention_input.h): qk-norm + RoPE, the dynamic-weight tail and the
// KV-row write in one launch of single-warp blocks.
#include "engine/cuda/attention_input.h"
#include "engine/cuda/device_util.cuh"
#include "engine/cuda/qk_rope.cuh"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace {

constexpr float kDynNormEps = 1e-6f;  // dyn_weights.cu
constexpr int kStage = 1024;          // floats: one head (hd <= 256) or u of a branch (K = 4N <= 1024)

// The cache row of step token t where its block table names a block, else null: as
// LaunchKvCacheWrite, every new row with a block is written (a window position no block
// keeps has entry -1; with prefix caching a window layer has a block for every position).
template <typename CT>
__device__ __forceinline__ CT* RowWithBlock(const AttentionInputParams& p, int t) {
  if (p.cache.base == nullptr) return nullptr;
  const StepView& s = p.step;
  const int seq = s.token_seq[t];
  const int pos = s.positions[t];
  const int blk = p.cache.block_table[static_cast<int64_t>(seq) * s.blocks_per_seq +
                                      pos / p.cache.block_size];
  if (blk < 0 || blk >= p.cache.num_blocks) return nullptr;
  const int64_t row = p.cache.row_elems;
  return static_cast<CT*>(p.cache.base) +
         static_cast<int64_t>(blk) * p.cache.layers_in_group * p.cache.block_size * row +
         static_cast<int64_t>(p.layer_in_group) * p.cache.block_size * row +
         static_cast<int64_t>(pos % p.cache.block_size) * row;
}

template <typename CT, typename QT>
__global__ void __launch_bounds__(32) AttentionInputKernel(AttentionInputParams p) {
  DCF_SHARED(float, buf, kStage);
  const int t = blockIdx.y;
  const int b = blockIdx.x;
  const int lane = threadIdx.x;
  const QkRopeParams& r = p.rope;
  const int N = r.n_head, hd = r.head_dim, nhd = N * hd;
  float* row = r.qkv + static_cast<int64_t>(t) * r.stride;

  if (b < 2 * N) {  // q (b < N) or k of one head: LaunchQkRope's steps for one item
    const bool is_k = b >= N;
    const int h = b % N;
    const int half = r.rotary_dim / 2;
    const int pos = r.positions[t];
    const float* cs = r.cos_table + static_cast<int64_t>(pos) * half;
    const float* sn = r.sin_table + static_cast<int64_t>(pos) * half;
    float* x = row + (is_k ? nhd : 0) + h * hd;
    dev::QkNormRopeHead(r, is_k, x, cs, sn, buf, 0, lane);
    if (!is_k) return;
    CT* cache_row = RowWithBlock<CT>(p, t);
    if (cache_row == nullptr) return;
    const float* v = row + 2 * nhd + h * hd;
    for (int d = lane; d < hd; d += 32) {
      cache_row[h * hd + d] = dev::FromFloat<CT>(x[d]);
      cache_row[nhd + h * hd + d] = dev::FromFloat<CT>(v[d]);
    }
    return;
  }

  // Row r2 of branch c of w: LaunchDynWeights' steps for one (token, branch, row).
  const DynWeightsParams& q = p.dyn;
  const int j = b - 2 * N;
  const int c = j / (2 * kRank), r2 = j % (2 * kRank);
  const int K = 4 * N, W = 2 * kRank * N;
  float* proj = q.proj + static_cast<int64_t>(t) * q.stride;
  for (int k = lane; k < K; k += 32) buf[k] = dev::GeluErf(proj[q.u_offset + c * K + k]);
  __syncwarp();
  const QT* qkw = static_cast<const QT*>(q.qkw) + static_cast<int64_t>(c) * K * W + r2 * N;
  constexpr int kHeadsPerLane = kMaxDynHeads / 32;
  float w[kHeadsPerLane];  // head n = lane + 32 i (constant indices once unrolled)
  float ss = 0;
DCF_UNROLL
  for (int i = 0; i < kHeadsPerLane; ++i) {
    const int n = lane + 32 * i;
    float acc = 0.0f;
    if (n < N) {
      for (int k = 0; k < K; ++k) acc += buf[k] * dev::ToFloat(qkw[static_cast<int64_t>(k) * W + n]);
      ss += acc * acc;
    }
    w[i] = acc;
  }
  if (r2 < kRank) {  // a W1 row: normalised over heads
    ss = dev::WarpSum(ss);
    const float inv = 1.0f / sqrtf(ss / N + kDynNormEps);
DCF_UNROLL
    for (int i = 0; i < kHeadsPerLane; ++i) w[i] *= inv;
  }
  float* dyn = q.dyn + static_cast<int64_t>(t) * q.dyn_stride + c * W + r2 * N;
  const bool key_side = c % 2 == 1;  // branches 1 (pre-key) and 3 (post-key)
  CT* cache_row = key_side ? RowWithBlock<CT>(p, t) : nullptr;
  const int terms = key_side ? 2 * nhd + (c / 2) * (2 * kRank + 1) * N : 0;
DCF_UNROLL
  for (int i = 0; i < kHeadsPerLane; ++i) {
    const int n = lane + 32 * i;
    if (n < N) {
      dyn[n] = w[i];
      if (cache_row != nullptr) cache_row[terms + r2 * N + n] = dev::FromFloat<CT>(w[i]);
    }
  }
  if (r2 != 0) return;
  for (int n = lane; n < N; n += 32) {  // G of branch c, in place
    float* g = proj + q.g_offset + c * N + n;
    const float gv = tanhf(*g);
    *g = gv;
    if (cache_row != nullptr) cache_row[terms + 2 * kRank * N + n] = dev::FromFloat<CT>(gv);
  }
}

template <typename CT>
struct ByQkw {
  template <typename QT>
  static cudaError_t Run(const AttentionInputParams& p, cudaStream_t stream) {
    const dim3 grid(2 * p.rope.n_head + kBranches * 2 * kRank, p.rope.num_tokens);
    DCF_LAUNCH((AttentionInputKernel<CT, QT>), grid, 32, 0, stream, p);
    return cudaGetLastError();
  }
};

struct ByCache {
  template <typename CT>
  static cudaError_t Run(const AttentionInputParams& p, cudaStream_t stream) {
    return dev::DispatchElem<ByQkw<CT>>(p.dyn.qkw_type, p, stream);
  }
};

}  // namespace

cudaError_t LaunchAttentionInput(const AttentionInputParams& p, cudaStream_t stream) {
  const QkRopeParams& r = p.rope;
  const DynWeightsParams& q = p.dyn;
  if (r.num_tokens <= 0) return cudaSuccess;
  const int N = r.n_head;
  if (N <= 0 || N > kMaxDynHeads || r.head_dim <= 0 || r.head_dim > kMaxQkRopeHeadDim ||
      r.rotary_dim % 2 != 0 || r.rotary_dim > r.head_dim || r.qkv == nullptr ||
      r.positions == nullptr ||
      (r.rotary_dim > 0 && (r.cos_table == nullptr || r.sin_table == nullptr)) ||
      (r.q_norm != nullptr) != (r.k_norm != nullptr) || q.num_tokens != r.num_tokens ||
      q.n_head != N || q.proj == nullptr || q.qkw == nullptr || q.dyn == nullptr) {
    return cudaErrorInvalidValue;
  }
  const CacheView& c = p.cache;
  if (c.base != nullptr &&
      (c.block_size <= 0 || c.layers_in_group <= 0 || p.layer_in_group < 0 ||
       p.layer_in_group >= c.layers_in_group || p.window < 0 ||
       c.row_elems != 2 * N * r.head_dim + 2 * (2 * kRank + 1) * N ||
       p.step.num_tokens != r.num_tokens || p.step.positions == nullptr ||
       p.step.seq_offsets == nullptr || p.step.token_seq == nullptr || c.block_table == nullptr)) {
    return cudaErrorInvalidValue;
  }
  return dev::DispatchElem<ByCache>(c.base != nullptr ? c.dtype : ElemType::kF32, p, stream);
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
