// Test scenarios for the DCMHA kernels (engine/cuda/dcmha_attention.h), built on the host
// with random inputs, run through the public launchers on device buffers, and checked
// against the CPU op (dcf::cpu::AttendOne) the way CpuBackend::AttentionLayer uses it.
//
// A scenario is one attention layer of one step: sequences with `start` cached positions and
// `n` new tokens each. Every position of every sequence gets a random f32 row (K, V, the
// key-side compose terms); cached positions are stored in the paged cache (rounded to the
// cache dtype, and the reference uses the rounded values), new positions come from the
// fresh inputs (qkv, dyn, gates). Physical blocks are shuffled, blocks a window layer does
// not keep are absent (-1) and unused cache memory holds NaN, so a read of a wrong row shows.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/cpu/dcmha.h"
#include "engine/simt/cuda_compat.h"
#include "engine/cuda/dcmha_attention.h"
#include "engine/kv/kv_layout.h"
#include "gtest/gtest.h"
#include "tests/unit/simt/cuda_test_util.h"

namespace dcf::cuda_test {

using ::dcf::cuda::DcmhaLayerArgs;
using ::dcf::cuda::ElemType;
using ::dcf::cuda::StepView;

inline constexpr int kC = ::dcf::cuda::kBranches;  // compose branches
inline constexpr int kI = ::dcf::cuda::kRank;

struct SeqSpec {
  int start = 0;  // cached positions [0, start)
  int n = 1;      // new tokens at positions [start, start + n)
};

struct Shape {
  int n_head = 8;
  int head_dim = 16;
  int window = 0;  // 0: global layer
  int block_size = 5;
  ElemType cache_dtype = ElemType::kF32;
  ElemType out_dtype = ElemType::kF32;
  bool compose = true;
};

inline int FirstKept(int window, int end) {
  return window > 0 && end - window + 1 > 0 ? end - window + 1 : 0;
}
inline int VisibleLo(int window, int pos) { return FirstKept(window, pos); }

// Host value of one element stored as `type` (round trip through the device format).
inline float RoundTo(ElemType type, float x) {
  switch (type) {
    case ElemType::kBF16:
      return __bfloat162float(__float2bfloat16_rn(x));
    case ElemType::kF16:
      return __half2float(__float2half_rn(x));
    default:
      return x;
  }
}

// Encodes / decodes host arrays of `type` as raw bytes.
inline void StoreElem(ElemType type, std::vector<uint8_t>& bytes, int64_t i, float x) {
  switch (type) {
    case ElemType::kF32:
      std::memcpy(&bytes[i * 4], &x, 4);
      break;
    case ElemType::kBF16: {
      const unsigned short u = __bfloat16_as_ushort(__float2bfloat16_rn(x));
      std::memcpy(&bytes[i * 2], &u, 2);
      break;
    }
    case ElemType::kF16: {
      const unsigned short u = __half_as_ushort(__float2half_rn(x));
      std::memcpy(&bytes[i * 2], &u, 2);
      break;
    }
  }
}
inline float LoadElem(ElemType type, const std::vector<uint8_t>& bytes, int64_t i) {
  if (type == ElemType::kF32) {
    float x;
    std::memcpy(&x, &bytes[i * 4], 4);
    return x;
  }
  unsigned short u;
  std::memcpy(&u, &bytes[i * 2], 2);
  return type == ElemType::kBF16 ? __bfloat162float(__ushort_as_bfloat16(u))
                                 : __half2float(__ushort_as_half(u));
}

// One layer of one step, on the host.
class Scenario {
 public:
  static constexpr int kLayersInGroup = 2;
  static constexpr int kLayer = 1;  // the layer the step runs (the other must stay untouched)

  // `all_blocks`: give every logical block a physical one, also those a window layer does
  // not keep, as prefix caching does (the KV write then stores those rows too).
  Scenario(const Shape& shape, std::vector<SeqSpec> seqs, uint32_t seed, bool all_blocks = false)
      : shape_(shape),
        seqs_(std::move(seqs)),
        layout_(shape.n_head, shape.head_dim),
        all_blocks_(all_blocks) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int N = shape.n_head, hd = shape.head_dim, row = layout_.row_floats();
    const int B = shape.block_size;
    // Step structure.
    seq_offsets_.push_back(0);
    for (int s = 0; s < num_seqs(); ++s) {
      for (int i = 0; i < seqs_[s].n; ++i) {
        positions_.push_back(seqs_[s].start + i);
        token_seq_.push_back(s);
      }
      seq_offsets_.push_back(static_cast<int32_t>(positions_.size()));
      blocks_per_seq_ = std::max(blocks_per_seq_, (seqs_[s].start + seqs_[s].n + B - 1) / B + 1);
    }
    const int T = num_tokens();
    // Rows of every position; fresh inputs with padded strides.
    qkv_stride_ = 3 * N * hd + 8;
    dyn_stride_ = kC * 2 * kI * N + 4;
    gates_stride_ = kC * N + 3;
    qkv_.assign(static_cast<size_t>(T) * qkv_stride_, 0.0f);
    dyn_.assign(static_cast<size_t>(T) * dyn_stride_, 0.0f);
    gates_.assign(static_cast<size_t>(T) * gates_stride_, 0.0f);
    rows_.resize(num_seqs());
    for (int s = 0; s < num_seqs(); ++s) {
      const int end = seqs_[s].start + seqs_[s].n;
      rows_[s].resize(static_cast<size_t>(end) * row);
      for (float& x : rows_[s]) x = normal(rng);
      for (int p = 0; p < end; ++p) {  // compose terms smaller, as after tanh / normalisation
        for (int e = layout_.terms_offset(); e < row; ++e) rows_[s][p * row + e] *= 0.3f;
      }
    }
    for (int t = 0; t < T; ++t) {
      const int s = token_seq_[t], p = positions_[t];
      const float* r = &rows_[s][static_cast<size_t>(p) * row];
      float* q = &qkv_[static_cast<size_t>(t) * qkv_stride_];
      for (int e = 0; e < N * hd; ++e) q[e] = normal(rng);
      std::copy(r, r + 2 * N * hd, q + N * hd);  // k | v
      float* d = &dyn_[static_cast<size_t>(t) * dyn_stride_];
      float* g = &gates_[static_cast<size_t>(t) * gates_stride_];
      for (int c = 0; c < kC; ++c) {
        const int kb = c / 2;  // key-side branches 1 and 3 come from the row
        for (int i = 0; i < 2 * kI * N; ++i) {
          d[c * 2 * kI * N + i] =
              c % 2 == 1 ? r[layout_.branch_offset(kb) + i] : 0.3f * normal(rng);
        }
        for (int m = 0; m < N; ++m) {
          g[c * N + m] =
              c % 2 == 1 ? r[layout_.branch_offset(kb) + 2 * kI * N + m] : 0.3f * normal(rng);
        }
      }
    }
    BuildCache(rng);
  }

  int num_seqs() const { return static_cast<int>(seqs_.size()); }
  int num_tokens() const { return static_cast<int>(positions_.size()); }
  const Shape& shape() const { return shape_; }
  const KvRowLayout& layout() const { return layout_; }
  const std::vector<SeqSpec>& seqs() const { return seqs_; }
  int num_blocks() const { return num_blocks_; }
  const std::vector<int32_t>& block_table() const { return table_; }
  int blocks_per_seq() const { return blocks_per_seq_; }
  int64_t cache_elems() const {
    return static_cast<int64_t>(num_blocks_) * kLayersInGroup * shape_.block_size *
           layout_.row_floats();
  }
  const std::vector<uint8_t>& cache_bytes() const { return cache_; }
  // Element index of (sequence, position, layer) in the cache; -1 without a block.
  int64_t CacheIndex(int s, int p, int layer) const {
    const int B = shape_.block_size;
    const int blk = table_[static_cast<size_t>(s) * blocks_per_seq_ + p / B];
    if (blk < 0) return -1;
    return ((static_cast<int64_t>(blk) * kLayersInGroup + layer) * B + p % B) *
           layout_.row_floats();
  }
  // The f32 row of (s, p): what LaunchKvCacheWrite stores (before rounding).
  const float* Row(int s, int p) const {
    return &rows_[s][static_cast<size_t>(p) * layout_.row_floats()];
  }
  bool Kept(int s, int p) const {  // a window layer keeps p after this step
    return p >= FirstKept(shape_.window, seqs_[s].start + seqs_[s].n);
  }

  // The CPU op for every token: [T, N * hd] f32.
  std::vector<float> Reference() const {
    const int N = shape_.n_head, hd = shape_.head_dim, row = layout_.row_floats();
    std::vector<float> out(static_cast<size_t>(num_tokens()) * N * hd);
    std::vector<std::vector<float>> ref_rows = rows_;  // cached rows as the cache holds them
    for (int s = 0; s < num_seqs(); ++s) {
      for (int p = 0; p < seqs_[s].start; ++p) {
        for (int e = 0; e < row; ++e) {
          float& x = ref_rows[s][static_cast<size_t>(p) * row + e];
          x = RoundTo(shape_.cache_dtype, x);
        }
      }
    }
    for (int t = 0; t < num_tokens(); ++t) {
      const int s = token_seq_[t], pos = positions_[t];
      const int end = seqs_[s].start + seqs_[s].n;
      const cpu::KeySegment seg{0, end, ref_rows[s].data(), row};
      cpu::QueryInputs qi;
      qi.q = &qkv_[static_cast<size_t>(t) * qkv_stride_];
      const float* d = &dyn_[static_cast<size_t>(t) * dyn_stride_];
      const float* g = &gates_[static_cast<size_t>(t) * gates_stride_];
      qi.pre_w = d;
      qi.pre_g = g;
      qi.post_w = d + 2 * 2 * kI * N;
      qi.post_g = g + 2 * N;
      qi.compose = shape_.compose;
      const int lo = VisibleLo(shape_.window, pos);
      std::vector<float> scratch(cpu::AttendScratchFloats(layout_, pos - lo + 1));
      cpu::AttendOne(layout_, qi, absl::MakeConstSpan(&seg, 1), lo, pos, scratch.data(),
                     &out[static_cast<size_t>(t) * N * hd]);
    }
    return out;
  }

  // Device copies of the step and layer inputs, and the argument structs pointing at them.
  struct Device {
    DeviceBuffer<int32_t> positions, seq_offsets, token_seq, table;
    DeviceBuffer<float> qkv, dyn, gates;
    DeviceBuffer<uint8_t> cache, out, workspace;
    StepView step;
    DcmhaLayerArgs args;
  };
  // `workspace_bytes` 0: DcmhaWorkspaceBytes for this step's shape.
  std::unique_ptr<Device> Upload(size_t workspace_bytes = 0) const {
    const int N = shape_.n_head, hd = shape_.head_dim;
    int max_keys = 1, max_pos = 0, max_n = 0;
    for (int t = 0; t < num_tokens(); ++t) {
      max_pos = std::max(max_pos, positions_[t]);
      max_keys = std::max(max_keys, positions_[t] - VisibleLo(shape_.window, positions_[t]) + 1);
    }
    for (const SeqSpec& s : seqs_) max_n = std::max(max_n, s.n);
    if (workspace_bytes == 0) {
      workspace_bytes = cuda::DcmhaWorkspaceBytes(N, hd, num_tokens(), num_seqs(), max_keys);
    }
    const size_t out_bytes =
        static_cast<size_t>(num_tokens()) * N * hd * cuda::ElemBytes(shape_.out_dtype);
    auto d = std::unique_ptr<Device>(
        new Device{DeviceBuffer<int32_t>(positions_),
                   DeviceBuffer<int32_t>(seq_offsets_),
                   DeviceBuffer<int32_t>(token_seq_),
                   DeviceBuffer<int32_t>(table_),
                   DeviceBuffer<float>(qkv_),
                   DeviceBuffer<float>(dyn_),
                   DeviceBuffer<float>(gates_),
                   DeviceBuffer<uint8_t>(cache_),
                   DeviceBuffer<uint8_t>(std::vector<uint8_t>(out_bytes, 0xFF)),
                   // NaN everywhere but the counters (DcmhaInitWorkspace): a read of
                   // workspace no kernel wrote shows.
                   DeviceBuffer<uint8_t>(
                       std::vector<uint8_t>(std::max<size_t>(workspace_bytes, 1), 0xFF)),
                   {},
                   {}});
    StepView& st = d->step;
    st.num_tokens = num_tokens();
    st.num_seqs = num_seqs();
    st.positions = d->positions.get();
    st.seq_offsets = d->seq_offsets.get();
    st.token_seq = d->token_seq.get();
    st.blocks_per_seq = blocks_per_seq_;
    st.max_seq_tokens = max_n;
    st.max_position = max_pos;
    DcmhaLayerArgs& a = d->args;
    a.n_head = N;
    a.head_dim = hd;
    a.window = shape_.window;
    a.layer_in_group = kLayer;
    a.compose = shape_.compose;
    a.qkv = d->qkv.get();
    a.qkv_stride = qkv_stride_;
    a.dyn = d->dyn.get();
    a.dyn_stride = dyn_stride_;
    a.gates = d->gates.get();
    a.gates_stride = gates_stride_;
    a.cache.base = d->cache.get();
    a.cache.dtype = shape_.cache_dtype;
    a.cache.num_blocks = num_blocks_;
    a.cache.layers_in_group = kLayersInGroup;
    a.cache.block_size = shape_.block_size;
    a.cache.row_elems = layout_.row_floats();
    a.cache.block_table = d->table.get();
    a.out = d->out.get();
    a.out_dtype = shape_.out_dtype;
    a.workspace = d->workspace.get();
    a.workspace_bytes = workspace_bytes;
    // A workspace too small for the counters is refused by LaunchDcmha (tests check that).
    if (cuda::DcmhaInitWorkspace(a.workspace, workspace_bytes, nullptr) == cudaSuccess) {
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
    return d;
  }

  // Like Upload, but the cache starts as NaN and its rows come from LaunchKvCacheWrite of an
  // earlier step that appended every cached position [0, start) of each sequence: checks that
  // the write and the attention agree on the layout.
  std::unique_ptr<Device> UploadFromHistory() const {
    auto d = Upload();
    const int N = shape_.n_head, hd = shape_.head_dim;
    std::vector<int32_t> pos, offsets{0}, tseq;
    std::vector<float> qkv, dyn, gates;
    for (int s = 0; s < num_seqs(); ++s) {
      for (int p = 0; p < seqs_[s].start; ++p) {
        pos.push_back(p);
        tseq.push_back(s);
        const float* r = Row(s, p);
        qkv.insert(qkv.end(), N * hd, 0.0f);  // q: unused by the write
        qkv.insert(qkv.end(), r, r + 2 * N * hd);
        for (int c = 0; c < kC; ++c) {
          for (int i = 0; i < 2 * kI * N; ++i) {
            dyn.push_back(c % 2 == 1 ? r[layout_.branch_offset(c / 2) + i] : 0.0f);
          }
        }
        for (int c = 0; c < kC; ++c) {
          for (int m = 0; m < N; ++m) {
            gates.push_back(c % 2 == 1 ? r[layout_.branch_offset(c / 2) + 2 * kI * N + m] : 0.0f);
          }
        }
      }
      offsets.push_back(static_cast<int32_t>(pos.size()));
    }
    std::vector<uint8_t> nan_cache(cache_.size());
    for (int64_t i = 0; i < cache_elems(); ++i) StoreElem(shape_.cache_dtype, nan_cache, i, NAN);
    EXPECT_TRUE(CudaOk(
        cudaMemcpy(d->cache.get(), nan_cache.data(), nan_cache.size(), cudaMemcpyHostToDevice)));
    if (pos.empty()) return d;
    DeviceBuffer<int32_t> d_pos(pos), d_off(offsets), d_tseq(tseq);
    DeviceBuffer<float> d_qkv(qkv), d_dyn(dyn), d_gates(gates);
    StepView st = d->step;
    st.num_tokens = static_cast<int>(pos.size());
    st.positions = d_pos.get();
    st.seq_offsets = d_off.get();
    st.token_seq = d_tseq.get();
    DcmhaLayerArgs a = d->args;
    a.qkv = d_qkv.get();
    a.qkv_stride = 3 * N * hd;
    a.dyn = d_dyn.get();
    a.dyn_stride = kC * 2 * kI * N;
    a.gates = d_gates.get();
    a.gates_stride = kC * N;
    EXPECT_TRUE(CudaOk(cuda::LaunchKvCacheWrite(st, a, nullptr)));
    EXPECT_TRUE(CudaOk(cudaDeviceSynchronize()));
    return d;
  }

  // The attention output of `d` as floats.
  std::vector<float> Output(const Device& d) const {
    const std::vector<uint8_t> bytes = d.out.ToHost();
    std::vector<float> out(static_cast<size_t>(num_tokens()) * shape_.n_head * shape_.head_dim);
    for (size_t i = 0; i < out.size(); ++i) out[i] = LoadElem(shape_.out_dtype, bytes, i);
    return out;
  }

 private:
  // Blocks: a shuffled physical id for every logical block that holds a position this step
  // reads from the cache or writes; the rest -1. Cached rows of `kLayer` are stored; all other
  // cache memory is NaN.
  void BuildCache(std::mt19937& rng) {
    const int B = shape_.block_size, W = shape_.window;
    std::vector<std::pair<int, int>> needed;  // (s, logical block)
    for (int s = 0; s < num_seqs(); ++s) {
      const int start = seqs_[s].start, end = start + seqs_[s].n;
      const int read_lo = FirstKept(W, start), write_lo = std::max(start, FirstKept(W, end));
      for (int b = 0; b * B < end; ++b) {
        const int lo = b * B, hi = std::min(end, lo + B);  // positions [lo, hi)
        const bool reads = lo < start && hi > read_lo;
        const bool writes = hi > write_lo;
        if (reads || writes || all_blocks_) needed.push_back({s, b});
      }
    }
    num_blocks_ = static_cast<int>(needed.size()) + 3;  // spare blocks stay NaN
    std::vector<int> ids(num_blocks_);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    table_.assign(static_cast<size_t>(num_seqs()) * blocks_per_seq_, -1);
    for (size_t i = 0; i < needed.size(); ++i) {
      table_[static_cast<size_t>(needed[i].first) * blocks_per_seq_ + needed[i].second] = ids[i];
    }
    const int elem = cuda::ElemBytes(shape_.cache_dtype);
    cache_.assign(static_cast<size_t>(cache_elems()) * elem, 0);
    for (int64_t i = 0; i < cache_elems(); ++i) StoreElem(shape_.cache_dtype, cache_, i, NAN);
    const int row = layout_.row_floats();
    for (int s = 0; s < num_seqs(); ++s) {
      for (int p = FirstKept(W, seqs_[s].start); p < seqs_[s].start; ++p) {
        const int64_t at = CacheIndex(s, p, kLayer);
        for (int e = 0; e < row; ++e) StoreElem(shape_.cache_dtype, cache_, at + e, Row(s, p)[e]);
      }
    }
  }

  Shape shape_;
  std::vector<SeqSpec> seqs_;
  KvRowLayout layout_;
  bool all_blocks_ = false;
  std::vector<int32_t> positions_, seq_offsets_, token_seq_;
  int blocks_per_seq_ = 1;
  int64_t qkv_stride_ = 0, dyn_stride_ = 0, gates_stride_ = 0;
  std::vector<float> qkv_, dyn_, gates_;
  std::vector<std::vector<float>> rows_;  // [S][end][row] f32
  int num_blocks_ = 0;
  std::vector<int32_t> table_;
  std::vector<uint8_t> cache_;
};

// Error of `got` against `want`: largest absolute difference and normalised mean squared
// error sum (got - want)^2 / sum want^2. NaN anywhere makes both infinite.
struct Error {
  double max_abs = 0;
  double nmse = 0;
};
inline Error Compare(const std::vector<float>& got, const std::vector<float>& want) {
  Error e;
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return {INFINITY, INFINITY};
    const double d = static_cast<double>(got[i]) - want[i];
    e.max_abs = std::max(e.max_abs, std::fabs(d));
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  e.nmse = den > 0 ? num / den : num;
  return e;
}

}  // namespace dcf::cuda_test
