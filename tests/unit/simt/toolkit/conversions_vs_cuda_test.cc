// The emulator's bf16/half and fp8 E4M3 conversions against the CUDA toolkit's own host
// implementation (cuda_bf16.hpp / cuda_fp16.hpp / cuda_fp8.hpp), which matches the device:
// every 16-bit pattern and every fp8 code to float or half, and float to bf16/half/fp8
// around every rounding boundary (every bf16 and half value is among them; every E4M3 tie,
// both signs and modes, is named on its own), plus a sweep of all float bit patterns with a
// prime stride.
// Needs the toolkit's headers, not a GPU.
#include <cmath>
#include <cstdint>
#include <cstring>

#include "gtest/gtest.h"
#include "tests/unit/simt/toolkit/conversions.h"

namespace dcf::cuda_test {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

TEST(ConversionsVsCudaTest, SixteenBitToFloat) {
  for (uint32_t h = 0; h < 65536; ++h) {
    ASSERT_EQ(Bits(sim_host::Bf16ToFloat(h)), Bits(cuda_host::Bf16ToFloat(h))) << std::hex << h;
    ASSERT_EQ(Bits(sim_host::HalfToFloat(h)), Bits(cuda_host::HalfToFloat(h))) << std::hex << h;
  }
}

TEST(ConversionsVsCudaTest, EveryFp8CodeToHalf) {
  for (uint32_t c = 0; c < 256; ++c) {
    ASSERT_EQ(sim_host::Fp8ToHalf(static_cast<uint8_t>(c)),
              cuda_host::Fp8ToHalf(static_cast<uint8_t>(c)))
        << std::hex << c;
  }
}

void ExpectSame(uint32_t bits) {
  const float f = FromBits(bits);
  for (const bool saturate : {true, false}) {
    ASSERT_EQ(sim_host::FloatToFp8(f, saturate), cuda_host::FloatToFp8(f, saturate))
        << "fp8 of 0x" << std::hex << bits << (saturate ? " satfinite" : " nosat");
  }
  ASSERT_EQ(sim_host::FloatToBf16(f), cuda_host::FloatToBf16(f))
      << "bf16 of 0x" << std::hex << bits;
  ASSERT_EQ(sim_host::FloatToHalf(f), cuda_host::FloatToHalf(f))
      << "half of 0x" << std::hex << bits;
}

TEST(ConversionsVsCudaTest, FloatToSixteenBitAtRoundingBoundaries) {
  // bf16 keeps the upper 16 bits: vary them all, with the lower bits at the boundaries.
  for (uint32_t high = 0; high < 65536; ++high) {
    for (uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      ExpectSame(high << 16 | low);
    }
  }
  // half keeps 10 of float's 23 mantissa bits: vary the upper 19 bits, the lower 13 at the
  // boundaries.
  for (uint32_t high = 0; high < (1u << 19); ++high) {
    for (uint32_t low : {0x0000u, 0x0001u, 0x0fffu, 0x1000u, 0x1001u, 0x1fffu}) {
      ExpectSame(high << 13 | low);
    }
  }
}

// The value of E4M3 code `c` by the toolkit (exact in half, then in float).
float E4M3(uint32_t c) {
  return cuda_host::HalfToFloat(cuda_host::Fp8ToHalf(static_cast<uint8_t>(c)));
}

// Float to E4M3 at every tie: the value exactly halfway between two adjacent E4M3 values
// (subnormal ones, steps of 2^-9 from the tie 2^-10 between 0 and the least subnormal, and
// normal ones up to 448), both signs, with the floats just below and above it, saturating
// and not. The ties whose lower code is even round down to it, the others up (to the even
// code above): the test checks that the toolkit did so, i.e. that each value is a tie. Then
// the ties and overflow beyond 448: 464 is a tie to the even 448 in both modes, anything
// above it 448 (satfinite) or NaN (nosat). The bf16 loop of
// FloatToSixteenBitAtRoundingBoundaries visits these floats too (a tie has 4 significant
// bits); here they are named.
TEST(ConversionsVsCudaTest, FloatToFp8AtTiesBetweenCodes) {
  int down = 0, up = 0;
  for (uint32_t c = 0; c + 1 < 0x7f; ++c) {  // c and c + 1 finite: 0 .. 448
    const float lo = E4M3(c), hi = E4M3(c + 1);
    const float tie = lo + (hi - lo) / 2;  // exact: one bit more than E4M3 has
    ASSERT_GT(tie, lo);
    ASSERT_LT(tie, hi);
    for (const float t : {tie, -tie}) {
      const uint32_t b = Bits(t);
      ExpectSame(b);
      ExpectSame(b - 1);  // the float toward zero
      ExpectSame(b + 1);  // and away from it
      for (const bool saturate : {true, false}) {
        const uint8_t code = cuda_host::FloatToFp8(t, saturate);
        EXPECT_EQ(code & 0x7f, c % 2 == 0 ? c : c + 1) << "tie " << t;
        EXPECT_EQ(code & 0x80, t < 0 ? 0x80 : 0) << "tie " << t;
      }
    }
    ++(c % 2 == 0 ? down : up);
  }
  EXPECT_EQ(down, 63);
  EXPECT_EQ(up, 63);
  for (const float beyond : {464.0f, 480.0f, 1e30f}) {
    for (const float t : {beyond, -beyond}) {
      ExpectSame(Bits(t) - 1);
      ExpectSame(Bits(t));
      ExpectSame(Bits(t) + 1);
    }
  }
  EXPECT_EQ(cuda_host::FloatToFp8(464.0f, false), 0x7e);
  EXPECT_EQ(cuda_host::FloatToFp8(-464.0f, false), 0xfe);
  EXPECT_EQ(cuda_host::FloatToFp8(std::nextafter(464.0f, 1e9f), true), 0x7e);
  EXPECT_EQ(cuda_host::FloatToFp8(std::nextafter(464.0f, 1e9f), false), 0x7f);
}

TEST(ConversionsVsCudaTest, FloatToSixteenBitStridedSweep) {
  // ~16.7 million patterns spread over all 2^32.
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 257) {
    ExpectSame(static_cast<uint32_t>(bits));
  }
}

}  // namespace
}  // namespace dcf::cuda_test
