// bf16 and half conversions on the device, bit for bit, against references computed here in
// double precision (a different method from the emulator's bit manipulation): every 16-bit
// pattern to float, and float to bf16/half on hand-picked edge cases, around every
// representable value and its rounding midpoints, and on random bit patterns.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/simt/cuda_test_util.h"
#include "tests/unit/simt/test_kernels.h"

namespace dcf::cuda_test {
namespace {

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

// Rounds |x| (finite, > 0) to `mantissa_bits` fraction bits with exponents clamped below at
// `min_exponent` (subnormals), ties to even; returns the rounded value.
double RoundMagnitude(double a, int mantissa_bits, int min_exponent) {
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1): leading bit 2^(e-1)
  const int lead = std::max(e - 1, min_exponent);
  const double ulp = std::ldexp(1.0, lead - mantissa_bits);
  return std::nearbyint(a / ulp) * ulp;  // exact scaling; default mode is to-nearest-even
}

// Encodes a representable magnitude in a format with `mantissa_bits` fraction bits and
// exponent bias `bias`.
uint32_t Encode(double v, int mantissa_bits, int bias) {
  const int min_exponent = 1 - bias;
  if (v == 0) return 0;
  if (v < std::ldexp(1.0, min_exponent)) {  // subnormal
    return static_cast<uint32_t>(v / std::ldexp(1.0, min_exponent - mantissa_bits));
  }
  const int e = std::ilogb(v);
  const double mantissa = v / std::ldexp(1.0, e - mantissa_bits) - std::ldexp(1.0, mantissa_bits);
  return (static_cast<uint32_t>(e + bias) << mantissa_bits) | static_cast<uint32_t>(mantissa);
}

uint16_t RefFloatToBf16(float f) {
  if (std::isnan(f)) return 0x7fff;
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (std::isinf(a)) return sign | 0x7f80;
  const double v = RoundMagnitude(a, 7, -126);
  if (v >= std::ldexp(1.0, 128)) return sign | 0x7f80;
  return sign | static_cast<uint16_t>(Encode(v, 7, 127));
}

uint16_t RefFloatToHalf(float f) {
  if (std::isnan(f)) return 0x7fff;
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (std::isinf(a)) return sign | 0x7c00;
  const double v = RoundMagnitude(a, 10, -14);
  if (v >= 65536.0) return sign | 0x7c00;
  return sign | static_cast<uint16_t>(Encode(v, 10, 15));
}

uint32_t RefBf16ToFloatBits(uint16_t h) {
  const int exponent = (h >> 7) & 0xff;
  const int mantissa = h & 0x7f;
  const bool negative = (h & 0x8000) != 0;
  if (exponent == 0xff && mantissa != 0) return static_cast<uint32_t>(h) << 16;  // payload kept
  double v = exponent == 0xff ? INFINITY
             : exponent == 0  ? std::ldexp(mantissa, -133)
                              : std::ldexp(128 + mantissa, exponent - 134);
  return Bits(static_cast<float>(negative ? -v : v));
}

uint32_t RefHalfToFloatBits(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  const bool negative = (h & 0x8000) != 0;
  if (exponent == 0x1f && mantissa != 0) return 0x7fffffffu;  // CUDA's canonical NaN
  double v = exponent == 0x1f ? INFINITY
             : exponent == 0  ? std::ldexp(mantissa, -24)
                              : std::ldexp(1024 + mantissa, exponent - 25);
  return Bits(static_cast<float>(negative ? -v : v));
}

TEST(HalfTypesTest, EverySixteenBitPatternToFloat) {
  DeviceBuffer<float> from_bf16(65536);
  DeviceBuffer<float> from_half(65536);
  ASSERT_TRUE(CudaOk(LaunchHalfsToFloat(from_bf16.get(), from_half.get(), nullptr)));
  const std::vector<float> bf = from_bf16.ToHost();
  const std::vector<float> hf = from_half.ToHost();
  for (uint32_t h = 0; h < 65536; ++h) {
    ASSERT_EQ(Bits(bf[h]), RefBf16ToFloatBits(h)) << "bf16 0x" << std::hex << h;
    ASSERT_EQ(Bits(hf[h]), RefHalfToFloatBits(h)) << "half 0x" << std::hex << h;
  }
}

struct Case {
  uint32_t in;  // float bits
  uint16_t bf16;
  uint16_t half;
};

// Values worked out by hand from IEEE round-to-nearest-even and CUDA's NaN rule.
const Case kEdgeCases[] = {
    {0x3f800000, 0x3f80, 0x3c00},  // 1
    {0x80000000, 0x8000, 0x8000},  // -0
    {0x3f808000, 0x3f80, 0x3c04},  // bf16 tie, even below
    {0x3f818000, 0x3f82, 0x3c0c},  // bf16 tie, even above
    {0x3f808001, 0x3f81, 0x3c04},  // just above a bf16 tie
    {0x3f801000, 0x3f80, 0x3c00},  // half tie (1 + 2^-11), even below
    {0x3f803000, 0x3f80, 0x3c02},  // half tie (1 + 3 * 2^-11), even above
    {0x7f7fffff, 0x7f80, 0x7c00},  // FLT_MAX: bf16 rounds up to inf
    {0x7f7f7fff, 0x7f7f, 0x7c00}, {0xff7fffff, 0xff80, 0xfc00},
    {0x477fe000, 0x4780, 0x7bff},  // 65504, the largest half
    {0x477fefff, 0x4780, 0x7bff},  // just below 65520
    {0x477ff000, 0x4780, 0x7c00},  // 65520 rounds to inf in half
    {0x7f800000, 0x7f80, 0x7c00},  // inf
    {0xff800000, 0xff80, 0xfc00},  // -inf
    {0x7fc00000, 0x7fff, 0x7fff},  // quiet NaN
    {0xffc00001, 0x7fff, 0x7fff},  // negative NaN: sign dropped
    {0x7f800001, 0x7fff, 0x7fff},  // signalling NaN
    {0x00000001, 0x0000, 0x0000},  // smallest float subnormal
    {0x00008000, 0x0000, 0x0000},  // bf16 subnormal tie, even (0) below
    {0x00018000, 0x0002, 0x0000},  // bf16 subnormal tie, even above
    {0x00008001, 0x0001, 0x0000}, {0x33800000, 0x3380, 0x0001},  // 2^-24: smallest half subnormal
    {0x33000000, 0x3300, 0x0000},                                // 2^-25: half tie, even (0)
    {0x33000001, 0x3300, 0x0001},                                // just above
    {0x33c00000, 0x33c0, 0x0002},                                // 1.5 * 2^-24: tie, even above
    {0x34200000, 0x3420, 0x0002},                                // 2.5 * 2^-24: tie, even below
    {0x387fffff, 0x3880, 0x0400},  // just below 2^-14 rounds up to the smallest normal half
    {0x38800000, 0x3880, 0x0400},  // 2^-14
    {0xb8800000, 0xb880, 0x8400},
};

void CheckFloatToHalfs(const std::vector<float>& in, bool use_reference,
                       const std::vector<Case>& cases) {
  DeviceBuffer<float> d_in(in);
  DeviceBuffer<unsigned short> bf16(in.size());
  DeviceBuffer<unsigned short> half(in.size());
  ASSERT_TRUE(CudaOk(LaunchFloatToHalfs(d_in.get(), bf16.get(), half.get(),
                                        static_cast<int>(in.size()), nullptr)));
  const std::vector<unsigned short> bf = bf16.ToHost();
  const std::vector<unsigned short> hf = half.ToHost();
  for (size_t i = 0; i < in.size(); ++i) {
    const uint16_t want_bf16 = use_reference ? RefFloatToBf16(in[i]) : cases[i].bf16;
    const uint16_t want_half = use_reference ? RefFloatToHalf(in[i]) : cases[i].half;
    ASSERT_EQ(bf[i], want_bf16) << "float bits 0x" << std::hex << Bits(in[i]);
    ASSERT_EQ(hf[i], want_half) << "float bits 0x" << std::hex << Bits(in[i]);
  }
}

TEST(HalfTypesTest, EdgeCases) {
  std::vector<Case> cases(std::begin(kEdgeCases), std::end(kEdgeCases));
  std::vector<float> in;
  for (const Case& c : cases) in.push_back(FromBits(c.in));
  CheckFloatToHalfs(in, /*use_reference=*/false, cases);
  // The references agree with the hand-worked values (so the sweeps below check the right
  // thing).
  for (const Case& c : cases) {
    EXPECT_EQ(RefFloatToBf16(FromBits(c.in)), c.bf16) << std::hex << c.in;
    EXPECT_EQ(RefFloatToHalf(FromBits(c.in)), c.half) << std::hex << c.in;
  }
}

TEST(HalfTypesTest, AroundEveryRepresentableValueAndMidpoint) {
  std::vector<float> in;
  auto add_around = [&](uint32_t bits) {
    for (int d = -1; d <= 1; ++d) in.push_back(FromBits(bits + static_cast<uint32_t>(d)));
  };
  for (uint32_t h = 0; h < 65536; ++h) {
    if ((h & 0x7f80) == 0x7f80) continue;  // inf / NaN patterns: covered by the edge cases
    add_around(h << 16);                   // a bf16 value and its float neighbours
    add_around((h << 16) | 0x8000);        // the midpoint to the next bf16 value
  }
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every finite half (sign added below)
    const float value = FromBits(RefHalfToFloatBits(static_cast<uint16_t>(h)));
    const float next = FromBits(RefHalfToFloatBits(static_cast<uint16_t>(h + 1)));
    for (float f : {value, 0.5f * (value + next)}) {
      add_around(Bits(f));
      add_around(Bits(-f));
    }
  }
  CheckFloatToHalfs(in, /*use_reference=*/true, {});
}

TEST(HalfTypesTest, RandomBitPatterns) {
  std::mt19937 rng(2024);
  std::vector<float> in(200000);
  for (float& f : in) f = FromBits(rng());
  CheckFloatToHalfs(in, /*use_reference=*/true, {});
}

}  // namespace
}  // namespace dcf::cuda_test
