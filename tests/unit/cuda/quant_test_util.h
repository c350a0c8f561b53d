// Host side of the quantized-weight tests (gemv_quant_test, gemm_quant_test): the matrices as
// the backend uploads them (engine/weights' per-channel rules), their decoded codes, and
// double-precision references.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "engine/cuda/gemm.h"
#include "engine/weights/dtype.h"
#include "engine/weights/fp8_quant.h"
#include "engine/weights/int8_quant.h"
#include "tests/unit/cuda/kernel_test_util.h"

namespace dcf::cuda_test {

// A [n, k] matrix quantized per output channel, as device_weights.cc does it.
struct HostQuantMatrix {
  cuda::WeightType type = cuda::WeightType::kI8;
  int n = 0, k = 0;
  std::vector<uint8_t> codes;  // [n, k]
  std::vector<float> scale;    // [n]
  std::vector<float> values;   // [n, k] the codes' values (unscaled), exact in f32
};

inline HostQuantMatrix QuantizeMatrix(const std::vector<float>& w, int n, int k,
                                      cuda::WeightType type) {
  HostQuantMatrix m;
  m.type = type;
  m.n = n;
  m.k = k;
  m.codes.resize(static_cast<size_t>(n) * k);
  m.scale.resize(n);
  m.values.resize(m.codes.size());
  for (int r = 0; r < n; ++r) {
    const float* row = w.data() + static_cast<size_t>(r) * k;
    uint8_t* q = m.codes.data() + static_cast<size_t>(r) * k;
    if (type == cuda::WeightType::kI8) {
      uint16_t bits = 0;
      QuantizeRowInt8(row, k, k, reinterpret_cast<int8_t*>(q), &bits);
      m.scale[r] = BF16ToFloat(bits);
    } else {
      m.scale[r] = QuantizeRowFp8E4M3(row, k, q);
    }
    for (int c = 0; c < k; ++c) {
      m.values[static_cast<size_t>(r) * k + c] =
          type == cuda::WeightType::kI8 ? static_cast<float>(static_cast<int8_t>(q[c]))
                                        : Fp8E4M3ToFloat(q[c]);
    }
  }
  return m;
}

// A product rounded on its own (the kernels' __fmul_rn): a call the compiler cannot fuse
// into a neighbouring add, whatever -ffp-contract says.
[[gnu::noinline]] inline float MulRounded(float a, float b) { return a * b; }

// The quantized Linear in double: y0[m, n] (+)= x[m, :] . values[n, :] * scale[n] (+ bias),
// x rows ldx apart (already rounded to the dtype), y rows ldy apart.
inline std::vector<float> QuantLinearWant(const std::vector<float>& xr, const HostQuantMatrix& w,
                                          const float* bias, std::vector<float> y0, int m,
                                          int64_t ldx, int64_t ldy, bool accumulate) {
  for (int r = 0; r < m; ++r) {
    for (int c = 0; c < w.n; ++c) {
      double s = 0;
      for (int i = 0; i < w.k; ++i) {
        s += double{xr[r * ldx + i]} * w.values[static_cast<size_t>(c) * w.k + i];
      }
      double v = s * w.scale[c] + (bias != nullptr ? bias[c] : 0.0);
      float& y = y0[r * ldy + c];
      y = static_cast<float>(accumulate ? y + v : v);
    }
  }
  return y0;
}

// x's rows quantized to E4M3 as LaunchQuantizeRowsFp8 does (quant_kernels.h): codes' values
// [m, k] and a scale per row.
inline void QuantizeActivationsFp8(const std::vector<float>& xr, int m, int k, int64_t ldx,
                                   std::vector<float>* values, std::vector<float>* scales) {
  values->assign(static_cast<size_t>(m) * k, 0.0f);
  scales->assign(m, 0.0f);
  for (int r = 0; r < m; ++r) {
    float amax = 0;
    for (int i = 0; i < k; ++i) amax = std::max(amax, std::abs(xr[r * ldx + i]));
    (*scales)[r] = amax / 448.0f;
    if (amax == 0) continue;
    const float inv = 448.0f / amax;
    for (int i = 0; i < k; ++i) {
      (*values)[static_cast<size_t>(r) * k + i] =
          Fp8E4M3ToFloat(FloatToFp8E4M3(MulRounded(xr[r * ldx + i], inv)));
    }
  }
}

// A device copy of the matrix: codes and scales.
struct DeviceQuantMatrix {
  explicit DeviceQuantMatrix(const HostQuantMatrix& m) : codes(m.codes), scale(m.scale) {}
  DeviceBuffer<uint8_t> codes;
  DeviceBuffer<float> scale;
};

inline const char* WeightName(cuda::WeightType t) { return cuda::WeightTypeName(t); }

}  // namespace dcf::cuda_test
