// fp8 E4M3 for the SIMT emulator: cuda_fp8.h's storage types, __nv_fp8_e4m3 and the
// conversions the kernels use, bit-exact with the toolkit's host implementation (which the
// device's cvt instructions match; tests/unit/simt/toolkit checks every code and a sweep of
// floats against it):
//   float -> e4m3 (__nv_cvt_float_to_fp8, __nv_fp8_e4m3(float)): round to nearest, ties to
//     even, on 3 mantissa bits with subnormals (steps of 2^-9 below 2^-6); |x| <= 2^-10 (half
//     the least subnormal, the tie included) becomes a zero of x's sign; any NaN becomes 0x7F;
//     beyond 464 (448, the largest finite, plus half its ulp; 464 itself is a tie to the even
//     448) and for infinities: __NV_SATFINITE gives +-448 (0x7E / 0xFE), __NV_NOSAT NaN
//     (0x7F / 0xFF: E4M3 has no infinity).
//   e4m3 -> half (__nv_cvt_fp8_to_halfraw, __nv_cvt_fp8x2_to_halfraw2): exact; 0x7F and 0xFF
//     (NaN) become half's canonical NaN 0x7FFF. The x2 forms take element 0 from the low byte.
//   __nv_fp8_e4m3 -> float (explicit operator float): the half value, widened exactly.
// Only the E4M3 interpretation: a conversion asked for __NV_E5M2 aborts (no kernel uses it).
// Like the 16-bit types, no implicit conversions and no arithmetic: kernels compute in float.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "engine/simt/half_types.h"

namespace dcf::simt {

typedef unsigned char __nv_fp8_storage_t;
typedef unsigned short __nv_fp8x2_storage_t;
typedef enum __nv_saturation_t { __NV_NOSAT, __NV_SATFINITE } __nv_saturation_t;
typedef enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 } __nv_fp8_interpretation_t;

// cuda_fp16.h's raw halves (the bits, no conversions).
struct alignas(2) __half_raw {
  unsigned short x;
};
struct alignas(4) __half2_raw {
  unsigned short x, y;
};

namespace detail {

inline void RequireE4M3(__nv_fp8_interpretation_t kind) {
  if (kind != __NV_E4M3) {
    std::fprintf(stderr, "dcf::simt: fp8 conversions emulate the E4M3 interpretation only\n");
    std::abort();
  }
}

// The E4M3 code of finite or infinite |x| (sign applied by the caller), NaN excluded.
inline unsigned char E4M3Magnitude(double a, bool saturate) {
  constexpr double kOverflow = 464.0;  // 448 + half of its ulp (32)
  if (a > kOverflow) return saturate ? 0x7e : 0x7f;
  // The spacing of E4M3 values around a: 2^(exponent - 3) for normals, 2^-9 below 2^-6.
  const int exponent = a >= 0x1p-6 ? std::ilogb(a) : -6;
  const double quantum = std::ldexp(1.0, exponent - 3);
  // a / quantum is exact (a power-of-two scaling of a float); rint rounds half to even.
  const double steps = std::nearbyint(a / quantum);
  const double v = steps * quantum;
  if (v < 0x1p-6) return static_cast<unsigned char>(steps);  // subnormal (8 steps: 2^-6, 0x08)
  const int e = std::ilogb(v);  // a carry may have raised the exponent
  const int mantissa = static_cast<int>(v / std::ldexp(1.0, e - 3)) - 8;
  return static_cast<unsigned char>(((e + 7) << 3) | mantissa);
}

// The value of an E4M3 code (NaN for 0x7F / 0xFF).
inline float E4M3Value(unsigned char c) {
  const int exponent = (c >> 3) & 0xf, mantissa = c & 0x7;
  const bool negative = (c & 0x80) != 0;
  if ((c & 0x7f) == 0x7f) return std::nanf("");
  const double v = exponent == 0 ? std::ldexp(static_cast<double>(mantissa), -9)
                                 : std::ldexp(static_cast<double>(8 + mantissa), exponent - 10);
  return static_cast<float>(negative ? -v : v);
}

}  // namespace detail

inline __nv_fp8_storage_t __nv_cvt_float_to_fp8(float x, __nv_saturation_t saturate,
                                                __nv_fp8_interpretation_t kind) {
  detail::RequireE4M3(kind);
  if (std::isnan(x)) return 0x7f;
  const unsigned char sign = std::signbit(x) ? 0x80 : 0x00;
  return static_cast<__nv_fp8_storage_t>(
      sign | detail::E4M3Magnitude(std::fabs(static_cast<double>(x)), saturate == __NV_SATFINITE));
}

inline __half_raw __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t x, __nv_fp8_interpretation_t kind) {
  detail::RequireE4M3(kind);
  // Every E4M3 value is a half value (2^-9 .. 448): the conversion is exact. A table, as the
  // GEMV decodes every weight through here.
  static const auto* const table = [] {
    auto* t = new unsigned short[256];
    for (int c = 0; c < 256; ++c) {
      const float v = detail::E4M3Value(static_cast<unsigned char>(c));
      t[c] = (c & 0x7f) == 0x7f ? 0x7fff : __half_as_ushort(__float2half_rn(v));
    }
    return t;
  }();
  return __half_raw{table[x]};
}

inline __half2_raw __nv_cvt_fp8x2_to_halfraw2(__nv_fp8x2_storage_t x,
                                             __nv_fp8_interpretation_t kind) {
  const __half_raw lo = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(x & 0xffu), kind);
  const __half_raw hi = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(x >> 8), kind);
  return __half2_raw{lo.x, hi.x};
}

// cuda_fp8.h's E4M3 storage type: explicit conversions only (from float with __NV_SATFINITE;
// to float through half, exactly).
struct alignas(1) __nv_fp8_e4m3 {
  __nv_fp8_storage_t __x;

  __nv_fp8_e4m3() = default;
  explicit __nv_fp8_e4m3(float f) : __x(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3)) {}
  explicit operator float() const {
    return __half2float(__ushort_as_half(__nv_cvt_fp8_to_halfraw(__x, __NV_E4M3).x));
  }
};

}  // namespace dcf::simt

using dcf::simt::__half2_raw;
using dcf::simt::__half_raw;
using dcf::simt::__nv_cvt_float_to_fp8;
using dcf::simt::__nv_cvt_fp8_to_halfraw;
using dcf::simt::__nv_cvt_fp8x2_to_halfraw2;
using dcf::simt::__nv_fp8_e4m3;
using dcf::simt::__nv_fp8_interpretation_t;
using dcf::simt::__nv_fp8_storage_t;
using dcf::simt::__nv_fp8x2_storage_t;
using dcf::simt::__nv_saturation_t;
using dcf::simt::__NV_E4M3;
using dcf::simt::__NV_E5M2;
using dcf::simt::__NV_NOSAT;
using dcf::simt::__NV_SATFINITE;
