// Dtype narrowing (float -> half / bf16, rounding to nearest even) and Tensor (loading a
// model's tensors in their stored dtype is in tests/unit/model/model_weights_test.cc).
#include "engine/weights/tensor.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "engine/weights/checkpoint.h"
#include "engine/weights/safetensors_reader.h"
#include "engine/weights/safetensors_writer.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace dcf {
namespace {

float NextUp(float f) { return std::nextafter(f, INFINITY); }

// Every finite half value converts to float and back to itself, and the midpoint between
// two neighbours rounds to the one with an even mantissa.
TEST(NarrowingTest, FloatToHalfRoundTripsAndRoundsHalfwayToEven) {
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // positive finite halves
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    ASSERT_EQ(FloatToHalf(f), h) << h;
    ASSERT_EQ(FloatToHalf(-f), h | 0x8000u) << h;
    if (h + 1 < 0x7c00) {
      const float mid = 0.5f * (f + HalfToFloat(static_cast<uint16_t>(h + 1)));
      const uint16_t even = (h & 1u) ? static_cast<uint16_t>(h + 1) : static_cast<uint16_t>(h);
      ASSERT_EQ(FloatToHalf(mid), even) << "midpoint above " << h;
      ASSERT_EQ(FloatToHalf(NextUp(mid)), h + 1) << "just above the midpoint of " << h;
    }
  }
  EXPECT_EQ(FloatToHalf(INFINITY), 0x7c00);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);          // halfway to 65536: rounds to inf
  EXPECT_EQ(FloatToHalf(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0);  // half the smallest subnormal: even (0)
}

TEST(NarrowingTest, FloatToBF16RoundTripsAndRoundsHalfwayToEven) {
  for (uint32_t b = 0; b < 0x7f80; b += 7) {
    const float f = BF16ToFloat(static_cast<uint16_t>(b));
    ASSERT_EQ(FloatToBF16(f), b);
    const float mid = f + 0.5f * (BF16ToFloat(static_cast<uint16_t>(b + 1)) - f);  // exact
    ASSERT_EQ(FloatToBF16(mid), (b & 1u) ? b + 1 : b) << b;
  }
  EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(NAN))));
  EXPECT_EQ(FloatToBF16(INFINITY), 0x7f80);
}

TEST(NarrowingTest, ConvertDTypeAgreesWithTheScalarConversions) {
  std::vector<float> src = {0.1f, -3.7f, 1e-6f, 65000.0f, 1.0f / 3};
  std::vector<uint16_t> half(src.size()), bf(src.size()), bf_from_half(src.size());
  ConvertDType(DType::kF32, src.data(), src.size(), DType::kF16, half.data());
  ConvertDType(DType::kF32, src.data(), src.size(), DType::kBF16, bf.data());
  ConvertDType(DType::kF16, half.data(), src.size(), DType::kBF16, bf_from_half.data());
  for (size_t i = 0; i < src.size(); ++i) {
    EXPECT_EQ(half[i], FloatToHalf(src[i]));
    EXPECT_EQ(bf[i], FloatToBF16(src[i]));
    EXPECT_EQ(bf_from_half[i], FloatToBF16(HalfToFloat(half[i])));
  }
}

TEST(TensorTest, ShapeBytesAndConversion) {
  Tensor t(DType::kF32, {2, 3});
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.nbytes(), 24u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
  for (int i = 0; i < 6; ++i) t.f32()[i] = 0.5f * i;
  const Tensor b = t.ConvertedTo(DType::kBF16);
  EXPECT_EQ(b.dtype(), DType::kBF16);
  EXPECT_EQ(b.shape(), t.shape());
  EXPECT_EQ(b.nbytes(), 12u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(BF16ToFloat(b.u16()[i]), 0.5f * i);
  EXPECT_TRUE(Tensor().empty());
  EXPECT_EQ(Tensor().f32_or_null(), nullptr);
}

}  // namespace
}  // namespace dcf
