#include "bench/loadgen/poisson_arrivals.h"

#include <cmath>

#include "engine/common/logging.h"

namespace dcf::loadgen {

PoissonArrivals::PoissonArrivals(double rate_per_s, uint64_t seed)
    : rate_per_s_(rate_per_s), rng_(seed) {
  DCF_CHECK(rate_per_s > 0 && std::isfinite(rate_per_s)) << "rate " << rate_per_s;
}

double PoissonArrivals::NextGapSeconds() {
  // Inverse-CDF sampling with u in [0, 1): -log(1 - u) is finite. Written out (rather than
  // std::exponential_distribution) so the schedule is the same with every standard library.
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
  return -std::log1p(-u) / rate_per_s_;
}

}  // namespace dcf::loadgen
