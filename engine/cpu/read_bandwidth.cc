#include "engine/cpu/read_bandwidth.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace dcf {
namespace {

__attribute__((target("avx512f"))) float SumAvx512(const float* p, size_t n) {
  // Eight independent accumulators: a full cache line per load, loads never wait on adds.
  __m512 acc[8];
  for (__m512& a : acc) a = _mm512_setzero_ps();
  for (size_t i = 0; i + 128 <= n; i += 128) {
    for (int j = 0; j < 8; ++j) acc[j] = _mm512_add_ps(acc[j], _mm512_load_ps(p + i + 16 * j));
  }
  for (int j = 1; j < 8; ++j) acc[0] = _mm512_add_ps(acc[0], acc[j]);
  return _mm512_reduce_add_ps(acc[0]);
}

float SumPortable(const float* p, size_t n) {
  float acc[16] = {};
  for (size_t i = 0; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) acc[j] += p[i + j];
  }
  float s = 0;
  for (float a : acc) s += a;
  return s;
}

}  // namespace

ReadBandwidth MeasureReadBandwidth(int threads, size_t bytes, int repeats) {
  ReadBandwidth r;
  r.threads = std::max(1, threads);
  r.avx512 = __builtin_cpu_supports("avx512f");
  // Each thread's part is a whole number of 512-byte chunks (the AVX-512 loop's stride).
  const size_t per_thread = bytes / r.threads / 512 * 512;
  if (per_thread == 0) return r;
  const size_t total = per_thread * r.threads;
  std::unique_ptr<float, decltype(&std::free)> buf(
      static_cast<float*>(std::aligned_alloc(64, total)), &std::free);
  if (buf == nullptr) return r;
  const size_t floats = per_thread / sizeof(float);
  volatile float sink = 0;
  double best = 0;
  for (int rep = 0; rep <= repeats; ++rep) {
    float sums[256] = {};
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(r.threads)
    {
      const int t = omp_get_thread_num();
      float* part = buf.get() + t * floats;
      // The first pass writes the buffer (first touch by the thread that reads it later).
      if (rep == 0) std::memset(part, 0, per_thread);
      const float s = r.avx512 ? SumAvx512(part, floats) : SumPortable(part, floats);
      if (t < 256) sums[t] = s;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (float v : sums) sink = sink + v;
    if (rep > 0) best = std::max(best, static_cast<double>(total) / s / 1e9);
  }
  r.gb_per_s = best;
  return r;
}

}  // namespace dcf
