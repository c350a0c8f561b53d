// The fp8 E4M3 weight rule (docs/QUANTIZATION.md, "GPU"), in one place: the CUDA backends'
// load-time quantization (--weight-dtype fp8) and the tests' host references call it.
//
// E4M3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; finite magnitudes 2^-9 .. 448,
// subnormals below 2^-6 in steps of 2^-9; no infinity; 0x7F / 0xFF are NaN. The conversion
// from float is CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) (and the
// emulator's, engine/simt/fp8_types.h): round to nearest, ties to even; |x| <= 2^-10 becomes
// a zero of x's sign; magnitudes above 464 (448 + half an ulp) and infinities become +-448;
// NaN becomes 0x7F.
//
// Per output channel (one row of a [out, in] matrix), with an fp32 scale:
//   amax  = max |w| over the row
//   scale = amax / 448                          (fp32 division; 0 for an all-zero row)
//   q     = e4m3(w / scale)                     (fp32 division, then the conversion above;
//                                                0 when scale is 0)
//   w    ~= float(q) * scale
// A NaN weight gives a NaN code; an infinite one an infinite scale, so its row's finite
// weights become 0 (--check-weights refuses both).
// Pure functions, thread-safe.
#pragma once

#include <cstdint>

namespace dcf {

inline constexpr float kFp8E4M3Max = 448.0f;

// float -> E4M3 code (satfinite, round to nearest even, NaN -> 0x7F).
uint8_t FloatToFp8E4M3(float x);
// E4M3 code -> float, exactly (NaN for 0x7F / 0xFF).
float Fp8E4M3ToFloat(uint8_t code);

// Quantizes one row: v[n] fp32 -> q[n] E4M3 codes; returns the row's scale.
float QuantizeRowFp8E4M3(const float* v, int64_t n, uint8_t* q);

}  // namespace dcf
