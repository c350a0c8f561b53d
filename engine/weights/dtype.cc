#include "engine/weights/dtype.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dcf {
namespace {

#if defined(__x86_64__)
// Hardware half->float conversion (F16C, every x86-64 CPU since 2012); exact like
// HalfToFloat. Selected at run time so the binary still runs on CPUs without it.
__attribute__((target("avx,f16c"))) void HalfToFloatF16c(const uint8_t* src, int64_t count,
                                                         float* dst) {
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < count; ++i) {
    uint16_t h;
    std::memcpy(&h, src + 2 * i, 2);
    dst[i] = HalfToFloat(h);
  }
}

bool HasF16c() {
  static const bool has = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  return has;
}
#endif

}  // namespace

int DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI8: return 1;
  }
  return 0;
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI8: return "I8";
  }
  return "?";
}

absl::StatusOr<DType> ParseSafetensorsDType(absl::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "I8") return DType::kI8;
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported tensor dtype '", name, "' (supported: F32, F16, BF16, I8)"));
}

void ConvertToF32(DType dtype, const void* src, int64_t count, float* dst) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(float));
      return;
    case DType::kF16: {
      const auto* s = static_cast<const uint8_t*>(src);
#if defined(__x86_64__)
      if (HasF16c()) {
        HalfToFloatF16c(s, count, dst);
        return;
      }
#endif
      for (int64_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        dst[i] = HalfToFloat(h);
      }
      return;
    }
    case DType::kBF16: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < count; ++i) {
        uint16_t b;
        std::memcpy(&b, s + 2 * i, 2);
        dst[i] = BF16ToFloat(b);
      }
      return;
    }
    case DType::kI8: {  // the integer values (exact); scales are applied elsewhere
      const auto* s = static_cast<const int8_t*>(src);
      for (int64_t i = 0; i < count; ++i) dst[i] = s[i];
      return;
    }
  }
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {  // subnormal half (or zero): scale into the subnormal grid
    float a;
    std::memcpy(&a, &abs, 4);
    const float scaled = a * 16777216.0f;  // 2^24: one half-subnormal ulp becomes 1.0
    const uint32_t m = static_cast<uint32_t>(std::nearbyint(scaled));
    return static_cast<uint16_t>(sign | m);
  }
  // Normal: rebias the exponent and round the mantissa to 10 bits, ties to even.
  uint32_t h = ((abs >> 13) - ((127u - 15u) << 10));
  const uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

void ConvertDType(DType from, const void* src, int64_t count, DType to, void* dst) {
  if (from == to) {
    std::memcpy(dst, src, static_cast<size_t>(count) * DTypeSize(from));
    return;
  }
  if (to == DType::kF32) {
    ConvertToF32(from, src, count, static_cast<float*>(dst));
    return;
  }
  // Narrowing: through fp32 in chunks (the widening step is exact, so F16 -> BF16 rounds
  // once).
  constexpr int64_t kChunk = 4096;
  float buf[kChunk];
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < count; i += kChunk) {
    const int64_t n = std::min(kChunk, count - i);
    ConvertToF32(from, s + i * DTypeSize(from), n, buf);  // a copy for F32 (any alignment)
    const float* f = buf;
    if (to == DType::kI8) {  // round and saturate (no loader asks for it: dtype.h)
      auto* d8 = static_cast<int8_t*>(dst);
      for (int64_t j = 0; j < n; ++j) {
        const float v = std::isnan(f[j]) ? 0.0f : std::nearbyint(f[j]);
        d8[i + j] = static_cast<int8_t>(std::clamp(v, -128.0f, 127.0f));
      }
    } else if (to == DType::kBF16) {
      for (int64_t j = 0; j < n; ++j) d[i + j] = FloatToBF16(f[j]);
    } else {
      for (int64_t j = 0; j < n; ++j) d[i + j] = FloatToHalf(f[j]);
    }
  }
}

int64_t CountNonFinite(DType dtype, const void* data, int64_t count, int64_t* first) {
  int64_t n = 0, at = -1;
  auto scan = [&](auto bits_of, uint32_t exponent) {
    for (int64_t i = 0; i < count; ++i) {
      if ((bits_of(i) & exponent) == exponent) {
        if (n++ == 0) at = i;
      }
    }
  };
  switch (dtype) {
    case DType::kF32: {
      const auto* p = static_cast<const uint32_t*>(data);
      scan([p](int64_t i) { return p[i]; }, 0x7f800000u);
      break;
    }
    case DType::kF16: {
      const auto* p = static_cast<const uint16_t*>(data);
      scan([p](int64_t i) { return uint32_t{p[i]}; }, 0x7c00u);
      break;
    }
    case DType::kBF16: {
      const auto* p = static_cast<const uint16_t*>(data);
      scan([p](int64_t i) { return uint32_t{p[i]}; }, 0x7f80u);
      break;
    }
    case DType::kI8:  // integers are always finite
      break;
  }
  if (first != nullptr) *first = at;
  return n;
}

absl::Status CheckFiniteConversion(absl::string_view tensor, DType from, const void* stored,
                                   int64_t count, DType to) {
  int64_t first = -1;
  const int64_t bad = CountNonFinite(from, stored, count, &first);
  if (bad > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", tensor, "' holds ", bad, " non-finite values (NaN or infinity), the first at "
        "flat index ", first, ": the checkpoint is corrupt"));
  }
  if (from == to) return absl::OkStatus();
  constexpr int64_t kChunk = 1 << 14;
  std::vector<uint8_t> converted(kChunk * DTypeSize(to));
  const auto* src = static_cast<const uint8_t*>(stored);
  int64_t over = 0;
  for (int64_t done = 0; done < count; done += kChunk) {
    const int64_t n = std::min(kChunk, count - done);
    ConvertDType(from, src + done * DTypeSize(from), n, to, converted.data());
    int64_t at = -1;
    over += CountNonFinite(to, converted.data(), n, &at);
    if (first < 0 && at >= 0) first = done + at;
  }
  if (over == 0) return absl::OkStatus();
  float value = 0;
  ConvertToF32(from, src + first * DTypeSize(from), 1, &value);
  return absl::InvalidArgumentError(absl::StrCat(
      "tensor '", tensor, "' holds ", over, " values beyond the range of ", DTypeName(to),
      ", the first at flat index ", first, " (", value, "): converted from the checkpoint's ",
      DTypeName(from), " they would be infinite; load it in a wider dtype"));
}

}  // namespace dcf
