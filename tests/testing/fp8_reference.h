// The fp8 E4M3 format from its definition, for tests of the emulator's conversions
// (tests/unit/simt/fp8_types_test.cc) and of the host quantizer (engine/weights/fp8_quant.h):
// a search over every code, slow and obviously right.
#ifndef DCF_TESTS_TESTING_FP8_REFERENCE_H_
#define DCF_TESTS_TESTING_FP8_REFERENCE_H_

#include <cmath>
#include <cstdint>

namespace dcf::testing {

// The magnitude of code c (0..0x7E) from the format's definition: bias 7, 3 mantissa bits.
inline double RefFp8Magnitude(int c) {
  const int e = c >> 3, m = c & 7;
  return e == 0 ? m * std::ldexp(1.0, -9) : (8 + m) * std::ldexp(1.0, e - 10);
}

// float -> E4M3 by search: the nearest finite magnitude, ties to the even code; beyond the
// largest finite value plus half its spacing (448 + 16), +-448 or NaN as `saturate` says.
inline uint8_t RefFloatToFp8(float f, bool saturate) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a > 464.0) return saturate ? sign | 0x7e : sign | 0x7f;
  int best = 0;
  for (int c = 1; c <= 0x7e; ++c) {
    const double d = std::fabs(RefFp8Magnitude(c) - a);
    const double bd = std::fabs(RefFp8Magnitude(best) - a);
    if (d < bd || (d == bd && c % 2 == 0)) best = c;
  }
  return static_cast<uint8_t>(sign | best);
}

}  // namespace dcf::testing

#endif  // DCF_TESTS_TESTING_FP8_REFERENCE_H_
