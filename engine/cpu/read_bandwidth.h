// Measures the memory read bandwidth this machine gives a streaming kernel: the ceiling of a
// memory-bound decode step (its roofline), so benchmarks can compare against the bandwidth
// measured in the same run rather than a datasheet figure.
// Thread-compatible (each call allocates its own buffer); uses OpenMP threads.
#pragma once

#include <cstddef>

namespace dcf {

struct ReadBandwidth {
  double gb_per_s = 0;  // 1e9 bytes per second, best of the repetitions
  int threads = 0;
  bool avx512 = false;  // the AVX-512 summing loop ran (else a portable one)
};

// Sums `bytes` of floats (rounded down to a multiple of 64 bytes) with `threads` OpenMP
// threads, each over its own contiguous part, `repeats` times after one warm-up pass that
// also faults the pages in, and reports the best repetition. Uses AVX-512 loads when the
// CPU has them. ResourceExhausted-like failures (no memory) return gb_per_s == 0.
ReadBandwidth MeasureReadBandwidth(int threads, size_t bytes = size_t{1} << 30, int repeats = 5);

}  // namespace dcf
