#include "engine/weights/int8_quant.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/weights/dtype.h"

namespace dcf {

void QuantizeRowInt8(const float* v, int64_t n, int group, int8_t* q, uint16_t* scales) {
  for (int64_t g = 0, k0 = 0; k0 < n; ++g, k0 += group) {
    const int64_t k1 = std::min<int64_t>(n, k0 + group);
    float absmax = 0;
    for (int64_t k = k0; k < k1; ++k) absmax = std::max(absmax, std::abs(v[k]));
    const uint16_t bits = FloatToBF16(absmax / 127.0f);
    const float scale = BF16ToFloat(bits);
    scales[g] = bits;
    for (int64_t k = k0; k < k1; ++k) {
      // nearbyint rounds half to even in the default rounding mode; a scale rounded down
      // may put the group's largest value just past 127, hence the clamp.
      // NaN (a NaN weight, or inf / inf) becomes 0: a float-to-int cast of NaN is undefined.
      const float r = scale > 0 ? std::nearbyint(v[k] / scale) : 0.0f;
      q[k] = std::isnan(r) ? 0 : static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
    }
  }
}

void QuantizeActivationRowInt8(const float* x, int64_t n, int group, uint8_t* u,
                               float* scales) {
  // Rounds |t| <= 127 half to even without a library call (the additions round in the
  // default mode; exact for |t| < 2^22), so the loop vectorises.
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23
  for (int64_t g = 0, k0 = 0; k0 < n; ++g, k0 += group) {
    const int64_t k1 = std::min<int64_t>(n, k0 + group);
    float absmax = 0;
    bool nan = false;
    for (int64_t k = k0; k < k1; ++k) {
      absmax = std::max(absmax, std::abs(x[k]));
      nan |= x[k] != x[k];
    }
    // A NaN makes the group's scale NaN, so every output it reaches is NaN (as the float
    // path's would be) instead of the NaN silently counting as 0.
    scales[g] = nan ? std::numeric_limits<float>::quiet_NaN() : absmax / 127.0f;
    const float inv = absmax > 0 ? 127.0f / absmax : 0.0f;
    // An absmax below about 3.7e-37 overflows the reciprocal (every nonzero x would map to
    // +-127): divide first there (rare, so the common loop stays a multiply).
    const bool tiny = inv > std::numeric_limits<float>::max();
    for (int64_t k = k0; k < k1; ++k) {
      const float t = tiny ? x[k] / absmax * 127.0f : x[k] * inv;
      const float c = t > 127.0f ? 127.0f : t < -127.0f ? -127.0f : t;
      const float r = (c + kRound) - kRound;
      // NaN (a NaN x, or an infinite one: inf * 0) becomes 0; the scale carries it.
      u[k] = static_cast<uint8_t>(128 + (r == r ? static_cast<int>(r) : 0));
    }
  }
  for (int64_t k = n; k < RoundUpTo4(n); ++k) u[k] = 128;
}

}  // namespace dcf
