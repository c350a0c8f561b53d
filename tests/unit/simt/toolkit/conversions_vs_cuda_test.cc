// The emulator's bf16/half and fp8 E4M3 conversions against the CUDA toolkit's own host
// implementation (cuda_bf16.hpp / cuda_fp16.hpp / cuda_fp8.hpp), which matches the device:
// every 16-bit pattern and every fp8 code to float or half, and float to bf16/half/fp8
// around every rounding boundary plus a sweep of all float bit patterns with a prime stride.
// Needs the toolkit's headers, not a GPU.
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

TEST(ConversionsVsCudaTest, FloatToSixteenBitStridedSweep) {
  // ~16.7 million patterns spread over all 2^32.
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 257) {
    ExpectSame(static_cast<uint32_t>(bits));
  }
}

}  // namespace
}  // namespace dcf::cuda_test
