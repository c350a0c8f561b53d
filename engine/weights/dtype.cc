#include "engine/weights/dtype.h"

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
  }
  return 0;
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
  }
  return "?";
}

absl::StatusOr<DType> ParseSafetensorsDType(absl::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported tensor dtype '", name, "' (supported: F32, F16, BF16)"));
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
  }
}

}  // namespace dcf
