#include "engine/cpu/fma_throughput.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>

namespace dcf {
namespace {

constexpr int kChains = 16;

// acc = acc * a + b on each chain: with a just below 1 and b small the values settle near
// b / (1 - a), never overflow and never become subnormal (which would slow the FMA down).
__attribute__((target("avx512f"))) float ChainsAvx512(long iterations, float a, float b) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
  for (long it = 0; it < iterations; ++it) {
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], va, vb);
  }
  for (int i = 1; i < kChains; ++i) acc[0] = _mm512_add_ps(acc[0], acc[i]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, acc[0]);
  float s = 0;
  for (float v : lanes) s += v;
  return s;
}

__attribute__((target("avx2,fma"))) float ChainsAvx2(long iterations, float a, float b) {
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
  for (long it = 0; it < iterations; ++it) {
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], va, vb);
  }
  for (int i = 1; i < kChains; ++i) acc[0] = _mm256_add_ps(acc[0], acc[i]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc[0]);
  float s = 0;
  for (float v : lanes) s += v;
  return s;
}

float ChainsPortable(long iterations, float a, float b) {
  float acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = static_cast<float>(i);
  for (long it = 0; it < iterations; ++it) {
    for (int i = 0; i < kChains; ++i) acc[i] = acc[i] * a + b;
  }
  float s = 0;
  for (float v : acc) s += v;
  return s;
}

}  // namespace

FmaThroughput MeasureFmaThroughput(int threads, long iterations, int repeats) {
  FmaThroughput r;
  r.threads = std::max(1, threads);
  int lanes = 1;
  if (__builtin_cpu_supports("avx512f")) {
    r.isa = "avx512";
    lanes = 16;
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    r.isa = "avx2";
    lanes = 8;
  }
  iterations = std::max(1L, iterations);
  // Read through a volatile so the compiler cannot fold the chains away.
  volatile float va = 0.999999f, vb = 1e-6f;
  const float a = va, b = vb;
  volatile float sink = 0;
  const double flops = 2.0 * kChains * lanes * static_cast<double>(iterations) * r.threads;
  double best = 0;
  for (int rep = 0; rep <= std::max(1, repeats); ++rep) {
    float sums[256] = {};
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(r.threads)
    {
      const int t = omp_get_thread_num();
      float s;
      if (lanes == 16) {
        s = ChainsAvx512(iterations, a, b);
      } else if (lanes == 8) {
        s = ChainsAvx2(iterations, a, b);
      } else {
        s = ChainsPortable(iterations, a, b);
      }
      if (t < 256) sums[t] = s;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (float v : sums) sink = sink + v;
    if (rep > 0 && s > 0) best = std::max(best, flops / s / 1e9);  // rep 0 warms up
  }
  r.gflop_per_s = best;
  return r;
}

}  // namespace dcf
