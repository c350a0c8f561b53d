#include "engine/weights/tensor.h"

#include <cstdlib>
#include <new>

#include "engine/common/logging.h"

namespace dcf {

void Tensor::Free::operator()(void* p) const { std::free(p); }

Tensor::Tensor(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  numel_ = 1;
  for (int64_t d : shape_) numel_ *= d;
  if (numel_ == 0) return;
  const size_t bytes = (nbytes() + 63) / 64 * 64;  // aligned_alloc needs a multiple
  void* p = std::aligned_alloc(64, bytes);
  if (p == nullptr) throw std::bad_alloc();
  data_.reset(static_cast<uint8_t*>(p));
}

float* Tensor::f32() {
  DCF_CHECK(dtype_ == DType::kF32) << "tensor is " << DTypeName(dtype_) << ", not F32";
  return reinterpret_cast<float*>(data_.get());
}
const float* Tensor::f32() const { return const_cast<Tensor*>(this)->f32(); }

uint16_t* Tensor::u16() {
  DCF_CHECK(dtype_ != DType::kF32) << "tensor is F32, not a 16-bit dtype";
  return reinterpret_cast<uint16_t*>(data_.get());
}
const uint16_t* Tensor::u16() const { return const_cast<Tensor*>(this)->u16(); }

Tensor Tensor::ConvertedTo(DType dtype) const {
  Tensor out(dtype, shape_);
  if (numel_ > 0) ConvertDType(dtype_, data(), numel_, dtype, out.data());
  return out;
}

}  // namespace dcf
