// The fp8 E4M3 rule of engine/weights/fp8_quant.h against a reference computed by search
// (the nearest of the 127 finite magnitudes, ties to the even code): every code to float, and
// float to E4M3 around every representable value and midpoint, at the edges (NaN, +-448, 464,
// infinities, the underflow tie 2^-10, subnormals) and on random bit patterns; then the
// per-channel row quantizer.
#include "engine/weights/fp8_quant.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/fp8_reference.h"

namespace dcf {
namespace {

using ::dcf::testing::RefFp8Magnitude;

// The host rule saturates (__NV_SATFINITE).
uint8_t RefFloatToFp8(float f) { return ::dcf::testing::RefFloatToFp8(f, /*saturate=*/true); }

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}


TEST(Fp8QuantTest, EveryCodeToFloat) {
  for (int c = 0; c < 256; ++c) {
    const float got = Fp8E4M3ToFloat(static_cast<uint8_t>(c));
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(got)) << c;
      continue;
    }
    const float want = static_cast<float>((c & 0x80 ? -1 : 1) * RefFp8Magnitude(c & 0x7f));
    ASSERT_EQ(Bits(got), Bits(want)) << "code " << c;
    // And back: every finite code is a fixed point of the conversion.
    ASSERT_EQ(FloatToFp8E4M3(got), c) << "code " << c;
  }
  EXPECT_EQ(Fp8E4M3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x01), std::ldexp(1.0f, -9));
}

TEST(Fp8QuantTest, FloatToFp8MatchesTheSearch) {
  std::vector<float> in = {0.0f, -0.0f, 448.0f, -448.0f, 464.0f, -464.0f, 480.0f, 1e30f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(), -std::nanf(""),
                           std::ldexp(1.0f, -10), -std::ldexp(1.0f, -10), FromBits(1)};
  auto add_around = [&](float f) {
    for (int d = -2; d <= 2; ++d) {
      in.push_back(FromBits(Bits(f) + static_cast<uint32_t>(d)));
      in.push_back(FromBits(Bits(-f) + static_cast<uint32_t>(d)));
    }
  };
  for (int c = 0; c <= 0x7e; ++c) {
    const double next = c < 0x7e ? RefFp8Magnitude(c + 1) : 480.0;
    add_around(static_cast<float>(RefFp8Magnitude(c)));
    add_around(static_cast<float>(0.5 * (RefFp8Magnitude(c) + next)));
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t r = rng();
    const uint32_t in_range = (r & 0x807fffffu) | ((115u + (r >> 23) % 22) << 23);
    in.push_back(i % 2 ? FromBits(r) : FromBits(in_range));
  }
  for (float f : in) ASSERT_EQ(FloatToFp8E4M3(f), RefFloatToFp8(f)) << std::hex << Bits(f);
  EXPECT_EQ(FloatToFp8E4M3(464.0f), 0x7e);                   // the tie stays at 448
  EXPECT_EQ(FloatToFp8E4M3(std::ldexp(1.0f, -10)), 0x00);    // the underflow tie: 0
  EXPECT_EQ(FloatToFp8E4M3(-std::ldexp(1.0f, -10)), 0x80);   // -0
  EXPECT_EQ(FloatToFp8E4M3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(FloatToFp8E4M3(-std::nanf("")), 0x7f);
}

TEST(Fp8QuantTest, RowQuantizationUsesTheRangeAndRoundsToNearest) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> v(1000);
  for (float& x : v) x = normal(rng);
  v[17] = -0.3f;  // the row's largest magnitude
  std::vector<uint8_t> q(v.size());
  const float scale = QuantizeRowFp8E4M3(v.data(), static_cast<int64_t>(v.size()), q.data());
  EXPECT_EQ(scale, 0.3f / 448.0f);
  EXPECT_EQ(q[17], 0xfe);  // -448
  for (size_t k = 0; k < v.size(); ++k) {
    EXPECT_EQ(q[k], FloatToFp8E4M3(v[k] / scale)) << k;
    // Round to nearest on 3 mantissa bits: within 2^-4 of the value (relative), or half a
    // subnormal step.
    const double back = Fp8E4M3ToFloat(q[k]) * static_cast<double>(scale);
    EXPECT_LE(std::abs(back - v[k]),
              std::max(std::abs(v[k]) / 16.0, std::ldexp(0.5, -9) * scale) * 1.0001)
        << k;
  }
  std::vector<float> zeros(64, 0.0f);
  std::vector<uint8_t> qz(64, 0xaa);
  EXPECT_EQ(QuantizeRowFp8E4M3(zeros.data(), 64, qz.data()), 0.0f);
  for (uint8_t c : qz) EXPECT_EQ(c, 0);
}

}  // namespace
}  // namespace dcf
