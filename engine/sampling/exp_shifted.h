// exp(v - shift) over a logit row in double precision, the probabilities the host sampler
// works with. Vectorised (AVX-512, 8 lanes) when the CPU has it, else std::exp per element.
// The vector path is a Cody-Waite reduction plus a degree-13 Taylor polynomial: within about
// 1 ulp of std::exp (the two may differ in the last bit). Thread-safe.
#pragma once

#include <cstdint>

namespace dcf {

// out[i] = exp((double)v[i] - shift) for i < n (0 where it underflows); returns their sum
// (accumulated in an order that depends on the path, in double).
double ExpShifted(const float* v, int64_t n, double shift, double* out);

}  // namespace dcf
