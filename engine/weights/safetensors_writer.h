// Writes fp32 host arrays as a .safetensors file, converting to F32, F16 or BF16
// (round-to-nearest-even), or tensors already in their stored dtypes. Used by dcformer-make-model and by tests that build their own
// checkpoints.
#pragma once

#include <functional>
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

// Same file format, but tensor i's values come from fill(i, dst) one tensor at a time, so a
// multi-gigabyte checkpoint can be written holding only its largest tensor in memory.
struct TensorShape {
  std::string name;
  std::vector<int64_t> shape;
};
absl::Status WriteSafetensors(const std::string& path, absl::Span<const TensorShape> tensors,
                              DType dtype,
                              const std::function<void(size_t, absl::Span<float>)>& fill);

// Tensors already in their stored dtype (any DType, mixed), written as given: what
// dcformer-quantize writes (I8 matrices beside BF16 scales and the float tensors).
struct StoredTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // NumElements(shape) elements of dtype, little-endian
};
absl::Status WriteSafetensors(const std::string& path, absl::Span<const StoredTensor> tensors);

}  // namespace dcf
