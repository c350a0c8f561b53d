// Writes fp32 host arrays as a .safetensors file, converting to F32, F16 or BF16
// (round-to-nearest-even). Used by dcformer-make-model and by tests that build their own
// checkpoints.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/weights/checkpoint.h"

namespace dcf {

struct TensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  absl::Span<const float> data;  // NumElements(shape) floats
};

// Writes `tensors` in order, all stored as `dtype`. Overwrites `path`.
absl::Status WriteSafetensors(const std::string& path, absl::Span<const TensorToWrite> tensors,
                              DType dtype);

// fp32 -> IEEE half / bfloat16 bits, round-to-nearest-even; NaN stays NaN.
uint16_t FloatToHalf(float f);
uint16_t FloatToBF16(float f);

}  // namespace dcf
