// fp8 E4M3 conversions on the device, bit for bit, against a reference computed here by
// another method than the emulator's: the nearest of the 127 finite magnitudes, found by
// search, ties to the even code. Every code to half and float; float to E4M3 (both
// saturation modes and the __nv_fp8_e4m3 constructor) on hand-worked edge cases (NaN, +-448,
// the overflow threshold 464, the underflow tie 2^-10, subnormals, ties), around every
// representable value and midpoint, and on random bit patterns.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/simt/cuda_test_util.h"
#include "tests/testing/fp8_reference.h"
#include "tests/unit/simt/test_kernels.h"

namespace dcf::cuda_test {
namespace {

using ::dcf::testing::RefFloatToFp8;
using ::dcf::testing::RefFp8Magnitude;

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


// E4M3 -> half bits, exactly (every E4M3 value is a half value).
uint16_t RefFp8ToHalf(int c) {
  if ((c & 0x7f) == 0x7f) return 0x7fff;
  const uint16_t sign = (c & 0x80) ? 0x8000 : 0;
  const double v = RefFp8Magnitude(c & 0x7f);
  if (v == 0) return sign;
  const int e = std::ilogb(v);
  if (e < -14) return sign | static_cast<uint16_t>(v / std::ldexp(1.0, -24));  // half subnormal
  const int mantissa = static_cast<int>(v / std::ldexp(1.0, e - 10)) - 1024;
  return sign | static_cast<uint16_t>(((e + 15) << 10) | mantissa);
}

TEST(Fp8TypesTest, EveryCodeToHalfAndFloat) {
  DeviceBuffer<unsigned short> half(256), pair(512);
  DeviceBuffer<float> value(256);
  ASSERT_TRUE(CudaOk(LaunchFp8ToHalf(half.get(), pair.get(), value.get(), nullptr)));
  const std::vector<unsigned short> h = half.ToHost(), p = pair.ToHost();
  const std::vector<float> v = value.ToHost();
  for (int c = 0; c < 256; ++c) {
    ASSERT_EQ(h[c], RefFp8ToHalf(c)) << "code 0x" << std::hex << c;
    ASSERT_EQ(p[2 * c], RefFp8ToHalf(c)) << "pair low, code 0x" << std::hex << c;
    ASSERT_EQ(p[2 * c + 1], RefFp8ToHalf(255 - c)) << "pair high, code 0x" << std::hex << c;
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v[c]));
    } else {
      const double want = (c & 0x80 ? -1 : 1) * RefFp8Magnitude(c & 0x7f);
      ASSERT_EQ(Bits(v[c]), Bits(static_cast<float>(want))) << "code 0x" << std::hex << c;
    }
  }
  EXPECT_EQ(h[0x7e], 0x5f00);  // 448
  EXPECT_EQ(h[0x01], 0x1800);  // 2^-9, the least subnormal
  EXPECT_EQ(h[0x80], 0x8000);  // -0
}

struct Case {
  uint32_t in;      // float bits
  uint8_t sat;      // __NV_SATFINITE
  uint8_t nosat;    // __NV_NOSAT
};

// Worked out by hand from round-to-nearest-even on E4M3 (values m * 2^(e-10), 3 mantissa
// bits; 2^-9 steps below 2^-6).
const Case kEdgeCases[] = {
    {0x3f800000, 0x38, 0x38},  // 1
    {0x80000000, 0x80, 0x80},  // -0
    {0x43e00000, 0x7e, 0x7e},  // 448, the largest finite
    {0xc3e00000, 0xfe, 0xfe},  // -448
    {0x43e80000, 0x7e, 0x7e},  // 464: a tie between 448 (even) and 480 (beyond the format)
    {0x43e80001, 0x7e, 0x7f},  // just above 464: overflow
    {0xc3e80001, 0xfe, 0xff},
    {0x43f00000, 0x7e, 0x7f},  // 480
    {0x7f800000, 0x7e, 0x7f},  // inf saturates to 448
    {0xff800000, 0xfe, 0xff},
    {0x7fc00000, 0x7f, 0x7f},  // NaN
    {0xffc00001, 0x7f, 0x7f},  // negative NaN: one canonical code
    {0x3b000000, 0x01, 0x01},  // 2^-9, the least subnormal
    {0x3a800000, 0x00, 0x00},  // 2^-10: a tie between 0 (even) and 2^-9
    {0x3a800001, 0x01, 0x01},  // just above 2^-10
    {0xba800000, 0x80, 0x80},  // -2^-10 rounds to -0
    {0x3b400000, 0x02, 0x02},  // 1.5 * 2^-9: a tie, even (2) above
    {0x3ba00000, 0x02, 0x02},  // 2.5 * 2^-9: a tie, even (2) below
    {0x3c7c0000, 0x08, 0x08},  // 7.875 * 2^-9 rounds up to 2^-6, the least normal
    {0x3f880000, 0x38, 0x38},  // 1.0625: a tie between 1 (even) and 1.125
    {0x3f980000, 0x3a, 0x3a},  // 1.1875: a tie between 1.125 and 1.25 (even)
    {0x3f780000, 0x38, 0x38},  // 0.96875: a tie between 0.9375 and 1 (even, a carry)
    {0x43780000, 0x78, 0x78},  // 248: a tie between 240 and 256 (even, next exponent)
    {0x00000001, 0x00, 0x00},  // the smallest float subnormal
};

void CheckFloatToFp8(const std::vector<float>& in, const std::vector<Case>* cases) {
  DeviceBuffer<float> d_in(in);
  DeviceBuffer<unsigned char> sat(in.size()), nosat(in.size()), ctor(in.size());
  ASSERT_TRUE(CudaOk(LaunchFloatToFp8(d_in.get(), sat.get(), nosat.get(), ctor.get(),
                                      static_cast<int>(in.size()), nullptr)));
  const std::vector<unsigned char> s = sat.ToHost(), ns = nosat.ToHost(), c = ctor.ToHost();
  for (size_t i = 0; i < in.size(); ++i) {
    const uint8_t want_sat = cases ? (*cases)[i].sat : RefFloatToFp8(in[i], true);
    const uint8_t want_nosat = cases ? (*cases)[i].nosat : RefFloatToFp8(in[i], false);
    ASSERT_EQ(s[i], want_sat) << "satfinite, float bits 0x" << std::hex << Bits(in[i]);
    ASSERT_EQ(ns[i], want_nosat) << "nosat, float bits 0x" << std::hex << Bits(in[i]);
    ASSERT_EQ(c[i], want_sat) << "constructor, float bits 0x" << std::hex << Bits(in[i]);
  }
}

TEST(Fp8TypesTest, EdgeCases) {
  std::vector<Case> cases(std::begin(kEdgeCases), std::end(kEdgeCases));
  std::vector<float> in;
  for (const Case& c : cases) in.push_back(FromBits(c.in));
  CheckFloatToFp8(in, &cases);
  // The reference agrees with the hand-worked values (so the sweeps below check the right
  // thing).
  for (const Case& c : cases) {
    EXPECT_EQ(RefFloatToFp8(FromBits(c.in), true), c.sat) << std::hex << c.in;
    EXPECT_EQ(RefFloatToFp8(FromBits(c.in), false), c.nosat) << std::hex << c.in;
  }
}

TEST(Fp8TypesTest, AroundEveryRepresentableValueAndMidpoint) {
  std::vector<float> in;
  auto add_around = [&](float f) {
    for (int d = -2; d <= 2; ++d) {
      in.push_back(FromBits(Bits(f) + static_cast<uint32_t>(d)));
      in.push_back(FromBits(Bits(-f) + static_cast<uint32_t>(d)));
    }
  };
  for (int c = 0; c <= 0x7e; ++c) {
    const double v = RefFp8Magnitude(c);
    const double next = c < 0x7e ? RefFp8Magnitude(c + 1) : 480.0;  // 480: the overflow side
    add_around(static_cast<float>(v));
    add_around(static_cast<float>(0.5 * (v + next)));  // exact in float
  }
  CheckFloatToFp8(in, nullptr);
}

TEST(Fp8TypesTest, RandomBitPatterns) {
  std::mt19937 rng(2025);
  std::vector<float> in(100000);
  for (size_t i = 0; i < in.size(); ++i) {
    // Half of them over all floats, half within E4M3's range (exponents -12 .. 9).
    const uint32_t r = rng();
    in[i] = i % 2 ? FromBits(r) : FromBits((r & 0x807fffffu) | ((115u + (r >> 23) % 22) << 23));
  }
  CheckFloatToFp8(in, nullptr);
}

}  // namespace
}  // namespace dcf::cuda_test
