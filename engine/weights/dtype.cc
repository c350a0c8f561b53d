#include "engine/weights/dtype.h"

#include "absl/strings/str_cat.h"

namespace dcf {

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
