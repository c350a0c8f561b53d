// A dense row-major tensor in host memory with a storage dtype (F32, F16 or BF16): how model
// weights are held between the checkpoint and a backend, which converts or uploads them.
//
// Move-only; the buffer is 64-byte aligned. A default-constructed Tensor (no elements) stands
// for an absent weight (a bias the architecture does not have).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/weights/dtype.h"

namespace dcf {

class Tensor {
 public:
  Tensor() = default;
  // Uninitialised storage for `shape` elements of `dtype`.
  Tensor(DType dtype, std::vector<int64_t> shape);

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * DTypeSize(dtype_); }
  bool empty() const { return numel_ == 0; }

  void* data() { return data_.get(); }
  const void* data() const { return data_.get(); }
  // Typed views; abort when the dtype differs (a programming error, not an input error).
  float* f32();
  const float* f32() const;
  uint16_t* u16();  // F16 or BF16 bits
  const uint16_t* u16() const;
  // f32() or nullptr when the tensor is empty (optional biases).
  const float* f32_or_null() const { return empty() ? nullptr : f32(); }

  // A copy converted to `dtype` (rounding to nearest even when narrowing).
  Tensor ConvertedTo(DType dtype) const;
  // Converts in place (no-op when the dtype is already `dtype`).
  void ConvertTo(DType dtype) {
    if (dtype != dtype_) *this = ConvertedTo(dtype);
  }

 private:
  struct Free {
    void operator()(void* p) const;
  };
  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  std::unique_ptr<uint8_t, Free> data_;
};

}  // namespace dcf
