// cuda_compat.h first: with DCF_CUDA_NS defined, dcmha_bench.h declares this build's
// (inline) namespace only.
#include "engine/cuda/dcmha_bench.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "engine/simt/cuda_compat.h"
#include "engine/cuda/dcmha_attention.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace {

std::string CudaError(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

// Device allocations of one case, freed on destruction.
class Allocations {
 public:
  ~Allocations() {
    for (void* p : ptrs_) cudaFree(p);
  }
  template <typename T>
  cudaError_t Alloc(T** p, size_t bytes) {
    void* v = nullptr;
    const cudaError_t e = cudaMalloc(&v, std::max<size_t>(bytes, 1));
    if (e != cudaSuccess) return e;
    ptrs_.push_back(v);
    bytes_ += static_cast<int64_t>(bytes);
    *p = static_cast<T*>(v);
    return cudaSuccess;
  }
  int64_t bytes() const { return bytes_; }

 private:
  std::vector<void*> ptrs_;
  int64_t bytes_ = 0;
};

// Deterministic values in [-scale, scale) (fast enough for 10^8 elements).
void Fill(std::vector<float>& v, uint64_t seed, float scale) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& f : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    f = scale * (static_cast<float>(x >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f);
  }
}

// Encodes floats as `type` (bytes).
std::vector<uint8_t> Encode(const std::vector<float>& v, ElemType type) {
  std::vector<uint8_t> out(v.size() * ElemBytes(type));
  for (size_t i = 0; i < v.size(); ++i) {
    if (type == ElemType::kF32) {
      std::memcpy(&out[i * 4], &v[i], 4);
    } else {
      const unsigned short u = type == ElemType::kBF16
                                   ? __bfloat16_as_ushort(__float2bfloat16_rn(v[i]))
                                   : __half_as_ushort(__float2half_rn(v[i]));
      std::memcpy(&out[i * 2], &u, 2);
    }
  }
  return out;
}

using cuda_bench::AttentionBenchCase;
using cuda_bench::AttentionBenchResult;

std::string RunAttentionBench(const AttentionBenchCase& c, AttentionBenchResult* result) {
  if (c.batch < 1 || c.n_head < 1 || c.head_dim < 1 || c.seq_len < 1 || c.block_size < 1 ||
      c.window < 0 || c.warmup < 0 || c.iters < 1 || c.dtype < 0 || c.dtype > 2) {
    return "invalid benchmark case";
  }
  int devices = 0;
  if (cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    return e != cudaSuccess ? CudaError("no CUDA device", e) : "no CUDA device";
  }
  cudaDeviceProp prop{};
  if (cudaError_t e = cudaGetDeviceProperties(&prop, 0); e != cudaSuccess) {
    return CudaError("cudaGetDeviceProperties", e);
  }
  result->device = prop.name;
  const ElemType dtype = static_cast<ElemType>(c.dtype);
  const int N = c.n_head, hd = c.head_dim, B = c.block_size;
  const int row = 2 * N * hd + 2 * (2 * kRank + 1) * N;
  // Step: every sequence has `seq_len` new tokens from 0 (prefill) or one at seq_len (decode).
  const int new_per_seq = c.decode ? 1 : c.seq_len;
  const int start = c.decode ? c.seq_len : 0;
  const int end = start + new_per_seq;
  const int64_t T = static_cast<int64_t>(c.batch) * new_per_seq;
  if (T > (int64_t{1} << 30)) return "too many tokens";
  std::vector<int32_t> positions(T), token_seq(T), offsets(c.batch + 1);
  for (int s = 0; s <= c.batch; ++s) offsets[s] = s * new_per_seq;
  for (int64_t t = 0; t < T; ++t) {
    token_seq[t] = static_cast<int32_t>(t / new_per_seq);
    positions[t] = start + static_cast<int32_t>(t % new_per_seq);
  }
  // Blocks for what the step reads (cached keys a window keeps) and writes (kept new rows).
  const int first_read = c.window > 0 ? std::max(0, start - c.window + 1) : 0;
  const int first_write = c.window > 0 ? std::max(start, end - c.window + 1) : start;
  const int first_block = std::min(start > 0 ? first_read : first_write, first_write) / B;
  const int blocks_per_seq = (end + B - 1) / B;
  const int used = blocks_per_seq - first_block;
  const int num_blocks = c.batch * used;
  std::vector<int32_t> table(static_cast<size_t>(c.batch) * blocks_per_seq, -1);
  for (int s = 0; s < c.batch; ++s) {
    for (int b = first_block; b < blocks_per_seq; ++b) {
      table[static_cast<size_t>(s) * blocks_per_seq + b] = s * used + (b - first_block);
    }
  }
  const int layers_in_group = 1;
  const int64_t cache_elems = static_cast<int64_t>(num_blocks) * layers_in_group * B * row;

  const int dyn_row = kBranches * 2 * kRank * N;  // [C, 2I, N]
  std::vector<float> qkv(static_cast<size_t>(T) * 3 * N * hd);
  std::vector<float> dyn(static_cast<size_t>(T) * dyn_row);
  std::vector<float> gates(static_cast<size_t>(T) * kBranches * N);
  std::vector<float> cache_f(static_cast<size_t>(cache_elems));
  Fill(qkv, 1, 1.0f);
  Fill(dyn, 2, 0.3f);
  Fill(gates, 3, 0.3f);
  Fill(cache_f, 4, 0.5f);
  const std::vector<uint8_t> cache_bytes = Encode(cache_f, dtype);
  cache_f = {};

  const int max_keys = c.window > 0 ? std::min(c.window, end) : end;
  const size_t ws_bytes = DcmhaWorkspaceBytes(N, hd, static_cast<int>(T), c.batch, max_keys);
  Allocations mem;
  int32_t *d_pos, *d_off, *d_seq, *d_table;
  float *d_qkv, *d_dyn, *d_gates;
  void *d_cache, *d_out, *d_ws;
  cudaError_t e = cudaSuccess;
  const char* failed = nullptr;  // the first call that failed, with its error in `e`
  auto step = [&](cudaError_t err, const char* what) {
    if (err != cudaSuccess && failed == nullptr) {
      failed = what;
      e = err;
    }
  };
  step(mem.Alloc(&d_pos, T * 4), "cudaMalloc");
  step(mem.Alloc(&d_seq, T * 4), "cudaMalloc");
  step(mem.Alloc(&d_off, offsets.size() * 4), "cudaMalloc");
  step(mem.Alloc(&d_table, table.size() * 4), "cudaMalloc");
  step(mem.Alloc(&d_qkv, qkv.size() * 4), "cudaMalloc");
  step(mem.Alloc(&d_dyn, dyn.size() * 4), "cudaMalloc");
  step(mem.Alloc(&d_gates, gates.size() * 4), "cudaMalloc");
  step(mem.Alloc(&d_cache, cache_bytes.size()), "cudaMalloc");
  step(mem.Alloc(&d_out, static_cast<size_t>(T) * N * hd * ElemBytes(dtype)), "cudaMalloc");
  step(mem.Alloc(&d_ws, ws_bytes), "cudaMalloc");
  if (failed != nullptr) return CudaError(failed, e);
  const cudaMemcpyKind h2d = cudaMemcpyHostToDevice;
  step(cudaMemcpy(d_pos, positions.data(), T * 4, h2d), "cudaMemcpy");
  step(cudaMemcpy(d_seq, token_seq.data(), T * 4, h2d), "cudaMemcpy");
  step(cudaMemcpy(d_off, offsets.data(), offsets.size() * 4, h2d), "cudaMemcpy");
  step(cudaMemcpy(d_table, table.data(), table.size() * 4, h2d), "cudaMemcpy");
  step(cudaMemcpy(d_qkv, qkv.data(), qkv.size() * 4, h2d), "cudaMemcpy");
  step(cudaMemcpy(d_dyn, dyn.data(), dyn.size() * 4, h2d), "cudaMemcpy");
  step(cudaMemcpy(d_gates, gates.data(), gates.size() * 4, h2d), "cudaMemcpy");
  step(cudaMemcpy(d_cache, cache_bytes.data(), cache_bytes.size(), h2d), "cudaMemcpy");
  step(DcmhaInitWorkspace(d_ws, ws_bytes, nullptr), "DcmhaInitWorkspace");
  step(cudaDeviceSynchronize(), "DcmhaInitWorkspace");
  if (failed != nullptr) return CudaError(failed, e);

  StepView sv;
  sv.num_tokens = static_cast<int>(T);
  sv.num_seqs = c.batch;
  sv.positions = d_pos;
  sv.seq_offsets = d_off;
  sv.token_seq = d_seq;
  sv.blocks_per_seq = blocks_per_seq;
  sv.max_seq_tokens = new_per_seq;
  sv.max_position = end - 1;
  DcmhaLayerArgs a;
  a.n_head = N;
  a.head_dim = hd;
  a.window = c.window;
  a.layer_in_group = 0;
  a.compose = c.compose;
  a.qkv = d_qkv;
  a.qkv_stride = 3 * N * hd;
  a.dyn = d_dyn;
  a.dyn_stride = dyn_row;
  a.gates = d_gates;
  a.gates_stride = kBranches * N;
  a.cache = {d_cache, dtype, num_blocks, layers_in_group, B, row, d_table};
  a.out = d_out;
  a.out_dtype = dtype;
  a.workspace = d_ws;
  a.workspace_bytes = ws_bytes;

  cudaStream_t stream = nullptr;
  if (cudaError_t err = cudaStreamCreate(&stream); err != cudaSuccess) {
    return CudaError("cudaStreamCreate", err);
  }
  cudaEvent_t begin = nullptr, done = nullptr;
  cudaEventCreate(&begin);
  cudaEventCreate(&done);
  auto forward = [&]() {
    cudaError_t err = LaunchKvCacheWrite(sv, a, stream);
    if (err == cudaSuccess) err = LaunchDcmha(sv, a, stream);
    return err;
  };
  std::string error;
  for (int i = 0; i < c.warmup && error.empty(); ++i) {
    if (cudaError_t err = forward(); err != cudaSuccess) error = CudaError("forward", err);
  }
  if (error.empty()) cudaEventRecord(begin, stream);
  for (int i = 0; i < c.iters && error.empty(); ++i) {
    if (cudaError_t err = forward(); err != cudaSuccess) error = CudaError("forward", err);
  }
  if (error.empty()) {
    cudaEventRecord(done, stream);
    if (cudaError_t err = cudaEventSynchronize(done); err != cudaSuccess) {
      error = CudaError("forward", err);
    }
  }
  float ms = 0;
  if (error.empty()) {
    if (cudaError_t err = cudaEventElapsedTime(&ms, begin, done); err != cudaSuccess) {
      error = CudaError("cudaEventElapsedTime", err);
    }
  }
  cudaEventDestroy(begin);
  cudaEventDestroy(done);
  cudaStreamDestroy(stream);
  if (!error.empty()) return error;

  result->ms_per_forward = static_cast<double>(ms) / c.iters;
  result->device_bytes = mem.bytes();
  result->query_tokens = T;
  // Rows read: every visible key of every query once per pass that reads it (K and the
  // pre-key terms in pass 1, V and the post-key terms in pass 2), from the cache or the
  // fresh f32 inputs; what a prefill re-reads from L2 for several queries counts once.
  const double cache_keys = static_cast<double>(c.batch) * (start - first_read);
  const double fresh_keys = static_cast<double>(T);
  const double per_key = (2.0 * N * hd + (c.compose ? 2 * (2 * kRank + 1) * N : 0));
  result->kv_bytes_read = cache_keys * per_key * ElemBytes(dtype) + fresh_keys * per_key * 4;
  return "";
}

}  // namespace
}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda

// This build's entry point (cmake/Cuda.cmake defines exactly one of the two macros).
namespace dcf::cuda_bench {
#if defined(DCF_CUDA_SIM)
namespace sim {
#else
namespace gpu {
#endif
std::string RunAttentionBench(const AttentionBenchCase& c, AttentionBenchResult* result) {
  return cuda::RunAttentionBench(c, result);
}
}  // namespace sim or gpu
}  // namespace dcf::cuda_bench
