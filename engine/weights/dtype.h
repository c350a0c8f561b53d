// Storage dtypes of checkpoint tensors and their conversion to fp32.
#pragma once

#include <cstdint>
#include <cstring>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace dcf {

// kI8: signed 8-bit integers, only the int8 weight matrices of a checkpoint written by
// dcformer-quantize (docs/QUANTIZATION.md); they mean nothing without their scale tensors,
// so loaders never convert them to or from the float dtypes.
enum class DType { kF32, kF16, kBF16, kI8 };

// Size of one element in bytes.
int DTypeSize(DType dtype);
// "F32", "F16", "BF16", "I8" (the safetensors spelling).
absl::string_view DTypeName(DType dtype);
// Parses the safetensors spelling; any other dtype (I64, F64, ...) is InvalidArgument.
absl::StatusOr<DType> ParseSafetensorsDType(absl::string_view name);

// IEEE half (binary16) bits to float, exact for every input including subnormals/inf/nan.
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// bfloat16 bits to float (exact: bf16 is the top half of an f32).
inline float BF16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// float to bfloat16 bits, rounding to nearest even (NaN stays a quiet NaN), as CUDA's
// __float2bfloat16 does.
inline uint16_t FloatToBF16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// float to IEEE half bits, rounding to nearest even, with subnormals, overflow to inf and
// quiet NaN, as CUDA's __float2half does.
uint16_t FloatToHalf(float f);

// Converts `count` little-endian elements of `dtype` at `src` to fp32 at `dst`.
void ConvertToF32(DType dtype, const void* src, int64_t count, float* dst);

// Converts `count` elements of `from` at `src` to `to` at `dst` (a plain copy when the dtypes
// are equal; narrowing rounds to nearest even).
void ConvertDType(DType from, const void* src, int64_t count, DType to, void* dst);

// Values among `count` elements of `dtype` at `data` that are NaN or infinite (exponent bits
// all ones), and the index of the first one in `first` (when not null; -1 when none).
int64_t CountNonFinite(DType dtype, const void* data, int64_t count, int64_t* first);

// The --check-weights verdict on one tensor named `tensor`: its `count` values at `stored` (as
// the checkpoint holds them, dtype `from`) are converted to `to` for serving. InvalidArgument
// "... the checkpoint is corrupt" when a stored value is NaN or infinite; InvalidArgument
// naming the conversion when every stored value is finite but some lie beyond `to`'s range
// (F32 -> F16 beyond 65504: they would serve as infinity); OK otherwise. Converts a chunk at a
// time into its own buffer: callers scan what they converted (CountNonFinite) and call this
// only when that found something, so a clean load pays nothing for it.
absl::Status CheckFiniteConversion(absl::string_view tensor, DType from, const void* stored,
                                   int64_t count, DType to);

}  // namespace dcf
