// Inter-arrival times of a Poisson process: independent exponential gaps with mean 1 / rate.
// Seeded, so a run's arrival schedule is reproducible. Thread-compatible.
#pragma once

#include <cstdint>
#include <random>

namespace dcf::loadgen {

class PoissonArrivals {
 public:
  // `rate_per_s` > 0 (checked).
  PoissonArrivals(double rate_per_s, uint64_t seed);

  // Seconds from the previous arrival to the next one.
  double NextGapSeconds();

 private:
  double rate_per_s_;
  std::mt19937_64 rng_;
};

}  // namespace dcf::loadgen
