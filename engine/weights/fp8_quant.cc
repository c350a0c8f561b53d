#include "engine/weights/fp8_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace dcf {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

}  // namespace

uint8_t FloatToFp8E4M3(float x) {
  const uint32_t u = Bits(x);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;            // NaN
  if (a > 0x43e80000u) return sign | 0x7e;     // beyond 464, infinity included: +-448
  if (a >= 0x3c800000u) {                      // normal: |x| >= 2^-6
    // Round the 23 mantissa bits to 3, ties to even; a carry raises the exponent, which is
    // right (464 itself is a tie that stays at the even 448).
    const uint32_t r = (a + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
    return static_cast<uint8_t>(sign | (r - ((127u - 7u) << 3)));
  }
  // Subnormal or zero: steps of 2^-9 (the scaling by 2^9 is exact), nearest even; 8 steps
  // are 2^-6, whose code is 0x08 too.
  const float steps = std::nearbyint(std::fabs(x) * 512.0f);
  return static_cast<uint8_t>(sign | static_cast<uint8_t>(steps));
}

float Fp8E4M3ToFloat(uint8_t code) {
  if ((code & 0x7f) == 0x7f) return std::nanf("");
  const int exponent = (code >> 3) & 0xf, mantissa = code & 7;
  const float v = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -9)
                                : std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);
  return (code & 0x80) ? -v : v;
}

float QuantizeRowFp8E4M3(const float* v, int64_t n, uint8_t* q) {
  float amax = 0;
  for (int64_t k = 0; k < n; ++k) amax = std::max(amax, std::abs(v[k]));
  const float scale = amax / kFp8E4M3Max;
  for (int64_t k = 0; k < n; ++k) q[k] = scale > 0 ? FloatToFp8E4M3(v[k] / scale) : 0;
  return scale;
}

}  // namespace dcf
