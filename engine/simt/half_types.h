// __nv_bfloat16 and __half for the SIMT emulator, with CUDA's conversion functions. The
// conversions are bit-exact with CUDA's: float -> bf16/half rounds to nearest even, overflow
// becomes infinity, subnormals are kept, and any NaN becomes the canonical NaN (0x7FFF);
// bf16 -> float is exact (NaN payloads kept, as on the device); half -> float is exact and
// turns every NaN into 0x7FFFFFFF, as CUDA does.
//
// Only the explicit functions exist, no implicit conversions and no arithmetic operators:
// cuda_compat.h compiles the real headers with __CUDA_NO_{HALF,BFLOAT16}_{CONVERSIONS,
// OPERATORS}__ so that both builds accept the same kernel code. Kernels compute in float.
#pragma once

#include <cstdint>
#include <cstring>

namespace dcf::simt {

// 16-bit storage types; trivially copyable, default construction leaves them uninitialized
// like CUDA's. The member name follows CUDA's raw structs; kernels never touch it.
struct alignas(2) __nv_bfloat16 {
  unsigned short __x;
};
struct alignas(2) __half {
  unsigned short __x;
};

namespace detail {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
// Shifts `mantissa` right by `shift` (1..31) bits, rounding to nearest, ties to even.
inline uint32_t ShiftRightRoundEven(uint32_t mantissa, uint32_t shift) {
  const uint32_t kept = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  return kept + ((rest > half || (rest == half && (kept & 1u) != 0u)) ? 1u : 0u);
}

}  // namespace detail

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  const uint32_t u = detail::FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{0x7fff};  // NaN
  // Rounding the upper 16 bits may carry into the exponent; that is exactly right
  // (largest finite values round up to infinity).
  return __nv_bfloat16{static_cast<unsigned short>(detail::ShiftRightRoundEven(u, 16))};
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }

inline float __bfloat162float(__nv_bfloat16 h) {
  return detail::BitsToFloat(static_cast<uint32_t>(h.__x) << 16);
}

inline __half __float2half_rn(float f) {
  const uint32_t u = detail::FloatBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t mag = u & 0x7fffffffu;
  uint32_t h;
  if (mag > 0x7f800000u) {
    return __half{0x7fff};  // NaN, sign dropped
  } else if (mag >= 0x477ff000u) {
    h = 0x7c00u;  // >= 65520 (max half + half an ulp) and infinity round to infinity
  } else if (mag >= 0x38800000u) {
    // Normal half: rebias the exponent (127 -> 15) and round 23 -> 10 mantissa bits.
    h = detail::ShiftRightRoundEven(mag - 0x38000000u, 13);
  } else if (mag > 0x33000000u) {
    // Subnormal half (units of 2^-24): value = (1.m) * 2^(e-127) = mant * 2^(e-150).
    const uint32_t exponent = mag >> 23;
    const uint32_t mantissa = (mag & 0x7fffffu) | 0x800000u;
    h = detail::ShiftRightRoundEven(mantissa, 126u - exponent);
  } else {
    h = 0;  // |f| <= 2^-25 rounds to zero (2^-25 itself is a tie to the even 0)
  }
  return __half{static_cast<unsigned short>(sign | h)};
}
inline __half __float2half(float f) { return __float2half_rn(f); }

inline float __half2float(__half h) {
  const uint32_t sign = static_cast<uint32_t>(h.__x & 0x8000u) << 16;
  const uint32_t exponent = (h.__x >> 10) & 0x1fu;
  const uint32_t mantissa = h.__x & 0x3ffu;
  if (exponent == 0x1fu) {
    return detail::BitsToFloat(mantissa != 0 ? 0x7fffffffu : (sign | 0x7f800000u));
  }
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  return detail::BitsToFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) { return __nv_bfloat16{bits}; }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __ushort_as_half(unsigned short bits) { return __half{bits}; }

}  // namespace dcf::simt

using dcf::simt::__bfloat162float;
using dcf::simt::__bfloat16_as_ushort;
using dcf::simt::__float2bfloat16;
using dcf::simt::__float2bfloat16_rn;
using dcf::simt::__float2half;
using dcf::simt::__float2half_rn;
using dcf::simt::__half;
using dcf::simt::__half2float;
using dcf::simt::__half_as_ushort;
using dcf::simt::__nv_bfloat16;
using dcf::simt::__ushort_as_bfloat16;
using dcf::simt::__ushort_as_half;
