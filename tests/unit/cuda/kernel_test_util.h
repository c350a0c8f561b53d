// Helpers of the CUDA backend's kernel tests (both builds): random data, 16-bit conversion
// on the host, and the error measures the tests bound (NMSE and max-abs against the CPU op).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "engine/cuda/dcmha_attention.h"
#include "engine/weights/dtype.h"
#include "tests/unit/simt/cuda_test_util.h"

namespace dcf::cuda_test {

inline std::vector<float> RandomVector(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Host references in double precision (the CPU backend's own matmul takes packed weights).
// y[T, out] = x[T, in] * w[out, in]^T (+ b[out] when b != nullptr).
inline void RefLinear(const float* x, const float* w, const float* b, int64_t T, int64_t in,
                      int64_t out, float* y) {
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t o = 0; o < out; ++o) {
      double acc = b != nullptr ? b[o] : 0.0;
      for (int64_t i = 0; i < in; ++i) acc += double{x[t * in + i]} * w[o * in + i];
      y[t * out + o] = static_cast<float>(acc);
    }
  }
}

// What a Linear writes into y0 (rows ldy apart): x[m, k] (rows ldx apart) . w[n, k]^T
// (+ bias) (+ y0 when accumulating), in double, on inputs already rounded to the dtype.
inline std::vector<float> LinearWant(const std::vector<float>& xr, const std::vector<float>& wr,
                                     const float* bias, std::vector<float> y0, int m, int n, int k,
                                     int64_t ldx, int64_t ldy, bool accumulate) {
  std::vector<float> xp(static_cast<size_t>(m) * k), ref(static_cast<size_t>(m) * n);
  for (int r = 0; r < m; ++r) {
    for (int c = 0; c < k; ++c) xp[r * k + c] = xr[r * ldx + c];
  }
  if (m > 0) RefLinear(xp.data(), wr.data(), bias, m, k, n, ref.data());
  for (int r = 0; r < m; ++r) {
    for (int c = 0; c < n; ++c) {
      y0[r * ldy + c] = ref[r * n + c] + (accumulate ? y0[r * ldy + c] : 0.0f);
    }
  }
  return y0;
}

// y[T, n] = x[T, k] * w[k, n] with row strides lda, ldb, ldc.
inline void RefMatMul(const float* x, int64_t lda, const float* w, int64_t ldb, int64_t T,
                      int64_t k, int64_t n, float* y, int64_t ldc) {
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t i = 0; i < k; ++i) acc += double{x[t * lda + i]} * w[i * ldb + j];
      y[t * ldc + j] = static_cast<float>(acc);
    }
  }
}

// Normalised mean squared error sum((got - want)^2) / sum(want^2).
inline double Nmse(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return den > 0 ? num / den : num;
}

inline double MaxAbs(const std::vector<float>& got, const std::vector<float>& want) {
  double m = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    m = std::max(m, std::abs(static_cast<double>(got[i]) - want[i]));
  }
  return m;
}

// Host values rounded to `type` (what the kernel sees after an upload in that dtype).
inline std::vector<float> RoundTo(const std::vector<float>& v, cuda::ElemType type) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    switch (type) {
      case cuda::ElemType::kF32:
        out[i] = v[i];
        break;
      case cuda::ElemType::kBF16:
        out[i] = BF16ToFloat(FloatToBF16(v[i]));
        break;
      case cuda::ElemType::kF16:
        out[i] = HalfToFloat(FloatToHalf(v[i]));
        break;
    }
  }
  return out;
}

// A device array holding `v` in `type` (raw bytes).
class TypedBuffer {
 public:
  TypedBuffer(const std::vector<float>& v, cuda::ElemType type)
      : type_(type), count_(v.size()), bytes_(v.size() * cuda::ElemBytes(type)) {
    std::vector<uint8_t> host(bytes_);
    if (type == cuda::ElemType::kF32) {
      std::memcpy(host.data(), v.data(), bytes_);
    } else {
      uint16_t* h = reinterpret_cast<uint16_t*>(host.data());
      for (size_t i = 0; i < v.size(); ++i) {
        h[i] = type == cuda::ElemType::kBF16 ? FloatToBF16(v[i]) : FloatToHalf(v[i]);
      }
    }
    buf_ = std::make_unique<DeviceBuffer<uint8_t>>(host);
  }
  // Uninitialised storage for `count` elements.
  TypedBuffer(size_t count, cuda::ElemType type)
      : type_(type), count_(count), bytes_(count * cuda::ElemBytes(type)) {
    buf_ = std::make_unique<DeviceBuffer<uint8_t>>(bytes_);
  }
  void* get() const { return buf_->get(); }
  std::vector<float> ToHost() const {
    const std::vector<uint8_t> host = buf_->ToHost();
    std::vector<float> out(count_);
    if (type_ == cuda::ElemType::kF32) {
      std::memcpy(out.data(), host.data(), bytes_);
    } else {
      const uint16_t* h = reinterpret_cast<const uint16_t*>(host.data());
      for (size_t i = 0; i < count_; ++i) {
        out[i] = type_ == cuda::ElemType::kBF16 ? BF16ToFloat(h[i]) : HalfToFloat(h[i]);
      }
    }
    return out;
  }

 private:
  cuda::ElemType type_;
  size_t count_, bytes_;
  std::unique_ptr<DeviceBuffer<uint8_t>> buf_;
};

inline const char* TypeName(cuda::ElemType t) {
  return t == cuda::ElemType::kF32 ? "f32" : t == cuda::ElemType::kBF16 ? "bf16" : "f16";
}

}  // namespace dcf::cuda_test
