// Times the DCMHA kernels alone (LaunchKvCacheWrite + LaunchDcmha: one attention "forward")
// on random inputs, for bench/attention (dcformer-attention-bench). Plain C++: callers
// outside engine/cuda see no CUDA type. The library is built twice (cmake/Cuda.cmake):
// dcf::cuda_bench::gpu::RunAttentionBench on a real device, dcf::cuda_bench::sim:: on the
// SIMT emulator; one binary may link both. (A namespace of its own, not dcf::cuda's inline
// DCF_CUDA_NS, so that plain C++ callers can name both builds.)
#pragma once

#include <cstdint>
#include <string>

namespace dcf::cuda_bench {

struct AttentionBenchCase {
  int batch = 32;     // sequences
  int n_head = 8;     // N
  int head_dim = 64;  // hd
  int seq_len = 128;  // prefill: tokens per sequence from position 0;
                      // decode: cached positions before each sequence's one new token
  bool decode = false;
  int window = 0;       // 0: global layer
  bool compose = true;  // false: plain multi-head attention
  int dtype = 1;        // cache and output: 0 float32, 1 bfloat16, 2 float16
  int block_size = 16;
  int warmup = 10;
  int iters = 100;
};

struct AttentionBenchResult {
  double ms_per_forward = 0;
  int64_t device_bytes = 0;  // inputs, KV cache, output and workspace of the forward
  double kv_bytes_read = 0;  // cache and fresh rows the attention reads per forward
  int64_t query_tokens = 0;
  std::string device;  // device name
};

// Returns "" and fills `result`, or a message saying what failed (no device, a CUDA error).
namespace sim {
std::string RunAttentionBench(const AttentionBenchCase& c, AttentionBenchResult* result);
}  // namespace sim
namespace gpu {
std::string RunAttentionBench(const AttentionBenchCase& c, AttentionBenchResult* result);
}  // namespace gpu

}  // namespace dcf::cuda_bench
