// Measures the fp32 FMA throughput this machine gives a kernel with no memory traffic: the
// compute ceiling of a compute-bound step (prefill, large-batch GEMMs), so benchmarks state
// their GFLOP/s against the peak measured in the same run rather than a datasheet figure
// (these machines are not all the same CPU). The partner of read_bandwidth.h.
// Thread-compatible (each call has its own state); uses OpenMP threads.
#pragma once

namespace dcf {

struct FmaThroughput {
  double gflop_per_s = 0;  // 1e9 flops per second (an FMA is 2), best of the repetitions
  int threads = 0;
  const char* isa = "portable";  // the loop that ran: "avx512", "avx2" or "portable"
};

// Each of `threads` OpenMP threads runs `iterations` rounds of 16 independent FMA chains on
// registers (enough to hide the FMA latency on the CPUs we run on), `repeats` times after
// one warm-up, and the best repetition's wall time gives the result. Uses AVX-512, else
// AVX2+FMA, else plain C++ (which the compiler may or may not vectorise).
FmaThroughput MeasureFmaThroughput(int threads, long iterations = long{1} << 21, int repeats = 5);

}  // namespace dcf
