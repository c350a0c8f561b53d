// The CPU matmul kernels (packed_matrix.h) against a plain double-precision reference, for
// every kernel this CPU can run (portable, avx2, avx512), every weight dtype, shapes that hit
// every row-block size and a partial last panel, strided x and y, with and without bias.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "engine/cpu/cpu_isa.h"
#include "engine/cpu/packed_matrix.h"
#include "gtest/gtest.h"

namespace dcf::cpu {
namespace {

// Source weights [out, in] in `dtype` bits, random in [-1, 1].
std::vector<uint8_t> RandomWeights(DType dtype, int64_t out, int64_t in, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<uint8_t> bytes(static_cast<size_t>(out * in) * DTypeSize(dtype));
  for (int64_t i = 0; i < out * in; ++i) {
    const float v = u(rng);
    if (dtype == DType::kF32) {
      reinterpret_cast<float*>(bytes.data())[i] = v;
    } else {
      reinterpret_cast<uint16_t*>(bytes.data())[i] =
          dtype == DType::kBF16 ? FloatToBF16(v) : FloatToHalf(v);
    }
  }
  return bytes;
}

float SourceAt(const std::vector<uint8_t>& w, DType dtype, int64_t i) {
  float f;
  ConvertToF32(dtype, w.data() + i * DTypeSize(dtype), 1, &f);
  return f;
}

struct Case {
  Isa isa;
  DType dtype;
};

class PackedMatrixTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (SupportedIsa(GetParam().isa) != GetParam().isa) {
      GTEST_SKIP() << "this CPU cannot run the " << IsaName(GetParam().isa) << " kernel";
    }
  }
};

TEST_P(PackedMatrixTest, PackingKeepsEveryWeight) {
  std::mt19937 rng(1);
  const DType dtype = GetParam().dtype;
  const int64_t out = 45, in = 7;
  const std::vector<uint8_t> w = RandomWeights(dtype, out, in, rng);
  const PackedMatrix rows = PackedMatrix::FromRows(w.data(), dtype, out, in, dtype);
  ASSERT_EQ(rows.num_panels(), 2);
  // The same matrix given column by column: [in, out] with a padded row stride.
  const int64_t ld = out + 3;
  std::vector<uint8_t> cols(static_cast<size_t>(in * ld) * DTypeSize(dtype), 0);
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t k = 0; k < in; ++k) {
      std::memcpy(&cols[(k * ld + o) * DTypeSize(dtype)], &w[(o * in + k) * DTypeSize(dtype)],
                  DTypeSize(dtype));
    }
  }
  const PackedMatrix columns = PackedMatrix::FromColumns(cols.data(), dtype, in, out, ld, dtype);
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t k = 0; k < in; ++k) {
      EXPECT_EQ(rows.At(o, k), SourceAt(w, dtype, o * in + k)) << o << "," << k;
      EXPECT_EQ(columns.At(o, k), rows.At(o, k)) << o << "," << k;
    }
  }
}

TEST_P(PackedMatrixTest, ConversionRoundsToNearestEven) {
  std::mt19937 rng(2);
  const std::vector<uint8_t> w = RandomWeights(DType::kF32, 33, 5, rng);
  const DType dtype = GetParam().dtype;
  const PackedMatrix m = PackedMatrix::FromRows(w.data(), DType::kF32, 33, 5, dtype);
  EXPECT_EQ(m.dtype(), dtype);
  for (int64_t i = 0; i < 33 * 5; ++i) {
    const float f = SourceAt(w, DType::kF32, i);
    const float expect = dtype == DType::kF32    ? f
                         : dtype == DType::kBF16 ? BF16ToFloat(FloatToBF16(f))
                                                 : HalfToFloat(FloatToHalf(f));
    EXPECT_EQ(m.At(i / 5, i % 5), expect);
  }
}

TEST_P(PackedMatrixTest, MatchesReference) {
  const auto [isa, dtype] = GetParam();
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const int64_t out : {1, 16, 31, 32, 33, 70}) {
    for (const int64_t in : {1, 2, 3, 64, 131}) {
      const std::vector<uint8_t> w = RandomWeights(dtype, out, in, rng);
      const PackedMatrix m = PackedMatrix::FromRows(w.data(), dtype, out, in, dtype);
      std::vector<float> bias(out);
      for (float& b : bias) b = u(rng);
      for (const int64_t rows : {1, 2, 3, 5, 8, 12, 13, 16, 25, 49, 61}) {
        for (const bool with_bias : {false, true}) {
          const int64_t ldx = in + 3, ldy = out + 5;
          std::vector<float> x(rows * ldx);
          for (float& v : x) v = u(rng);
          std::vector<float> y(rows * ldy, -7.0f);
          MatMul(x.data(), ldx, rows, m, with_bias ? bias.data() : nullptr, y.data(), ldy, isa);
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t o = 0; o < out; ++o) {
              double ref = with_bias ? bias[o] : 0.0, mag = std::abs(ref);
              for (int64_t k = 0; k < in; ++k) {
                const double p = static_cast<double>(x[r * ldx + k]) * SourceAt(w, dtype, o * in + k);
                ref += p;
                mag += std::abs(p);
              }
              ASSERT_NEAR(y[r * ldy + o], ref, 1e-6 * mag + 1e-7)
                  << "out " << out << " in " << in << " rows " << rows << " at (" << r << ", "
                  << o << ")";
            }
            for (int64_t o = out; o < ldy; ++o) {  // the padding of y is never written
              ASSERT_EQ(y[r * ldy + o], -7.0f) << "wrote past the outputs at " << o;
            }
          }
        }
      }
    }
  }
}

// Widening inside the kernel is exact for every 16-bit pattern (subnormals, inf, NaN).
TEST_P(PackedMatrixTest, WidensEveryBitPatternExactly) {
  const auto [isa, dtype] = GetParam();
  if (dtype == DType::kF32) GTEST_SKIP() << "nothing to widen";
  std::vector<uint16_t> w(65536);
  for (int i = 0; i < 65536; ++i) w[i] = static_cast<uint16_t>(i);
  const PackedMatrix m = PackedMatrix::FromRows(w.data(), dtype, 65536, 1, dtype);
  const float one = 1.0f;
  std::vector<float> y(65536);
  MatMul(&one, 1, 1, m, nullptr, y.data(), 65536, isa);
  for (int i = 0; i < 65536; ++i) {
    const float expect = dtype == DType::kF16 ? HalfToFloat(w[i]) : BF16ToFloat(w[i]);
    if (std::isnan(expect)) {
      ASSERT_TRUE(std::isnan(y[i])) << std::hex << i;
    } else {
      ASSERT_EQ(y[i], expect) << std::hex << i;
    }
  }
}

TEST_P(PackedMatrixTest, RowsGiveTheSameBitsAloneAndInLargeProductsOnThreads) {
  const auto [isa, dtype] = GetParam();
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> u(-1, 1);
  // > 192 rows and > 256 columns: two row blocks and two column blocks of the AVX-512
  // kernel (partial sums accumulated in y), two row blocks of the generic one.
  const int64_t out = 300, in = 257, rows = 197;
  const std::vector<uint8_t> w = RandomWeights(dtype, out, in, rng);
  const PackedMatrix m = PackedMatrix::FromRows(w.data(), dtype, out, in, dtype);
  std::vector<float> x(rows * in);
  for (float& v : x) v = u(rng);
  std::vector<float> y(rows * out), ref(rows * out);
  MatMul(x.data(), in, rows, m, nullptr, y.data(), out, isa);
  for (int64_t r = 0; r < rows; ++r) {
    MatMul(&x[r * in], in, 1, m, nullptr, &ref[r * out], out, isa);  // small: one thread
  }
  // Bit for bit: a row's result does not depend on the rows computed with it.
  for (int64_t i = 0; i < rows * out; ++i) {
    ASSERT_EQ(y[i], ref[i]) << "row " << i / out << " output " << i % out;
  }
  // And against the double reference, with a bias (added once, not per column block).
  std::vector<float> bias(out);
  for (float& b : bias) b = u(rng);
  MatMul(x.data(), in, rows, m, bias.data(), y.data(), out, isa);
  for (int64_t r = 0; r < rows; r += 7) {
    for (int64_t o = 0; o < out; ++o) {
      double want = bias[o], mag = std::abs(want);
      for (int64_t k = 0; k < in; ++k) {
        const double p = static_cast<double>(x[r * in + k]) * m.At(o, k);
        want += p;
        mag += std::abs(p);
      }
      ASSERT_NEAR(y[r * out + o], want, 1e-6 * mag + 1e-7) << r << "," << o;
    }
  }
}

// Rows of x, each multiplied alone (the 1-3-row kernel, its sub-blocks interleaved) and with
// 1-24 others (that kernel for 2-3 rows, every pass size of the blocked one from 4 rows on),
// must give the same bits: `in` covers a partial sub-block, 1-3 whole sub-blocks after the
// interleaved spans, and partial column blocks.
void ExpectOneRowBitsInEveryPassSize(const PackedMatrix& m, Isa isa, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  const int64_t in = m.in(), out = m.out();
  std::vector<float> bias(out);
  for (float& b : bias) b = u(rng);
  // 193-195: a pass of 192 rows, then the 1-3-row kernel on the rest.
  for (const int64_t rows : {2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 24, 25, 193, 194, 195}) {
    const int64_t ldx = in + 1, ldy = out + 2;
    std::vector<float> x(rows * ldx);
    for (float& v : x) v = u(rng);
    for (const bool with_bias : {false, true}) {
      const float* b = with_bias ? bias.data() : nullptr;
      std::vector<float> y(rows * ldy), one(out);
      MatMul(x.data(), ldx, rows, m, b, y.data(), ldy, isa);
      for (int64_t r = 0; r < rows; ++r) {
        MatMul(&x[r * ldx], ldx, 1, m, b, one.data(), out, isa);
        for (int64_t o = 0; o < out; ++o) {  // bits: a zero's sign too
          ASSERT_EQ(std::bit_cast<uint32_t>(y[r * ldy + o]), std::bit_cast<uint32_t>(one[o]))
              << "in " << in << " rows " << rows << " bias " << with_bias << " at " << r << ","
              << o << ": " << y[r * ldy + o] << " vs " << one[o];
        }
      }
    }
  }
}

TEST_P(PackedMatrixTest, OneRowKernelGivesTheBitsOfEveryMultiRowPass) {
  const auto [isa, dtype] = GetParam();
  std::mt19937 rng(5);
  for (const int64_t in : {1, 63, 64, 200, 256, 257, 300, 700, 1027}) {
    const int64_t out = 45;  // a partial last panel
    const std::vector<uint8_t> w = RandomWeights(dtype, out, in, rng);
    ExpectOneRowBitsInEveryPassSize(PackedMatrix::FromRows(w.data(), dtype, out, in, dtype), isa,
                                    static_cast<uint32_t>(in));
  }
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return std::string(IsaName(info.param.isa)) + "_" + std::string(DTypeName(info.param.dtype));
}

INSTANTIATE_TEST_SUITE_P(
    AllKernels, PackedMatrixTest,
    ::testing::Values(Case{Isa::kPortable, DType::kF32}, Case{Isa::kPortable, DType::kF16},
                      Case{Isa::kPortable, DType::kBF16}, Case{Isa::kAvx2, DType::kF32},
                      Case{Isa::kAvx2, DType::kF16}, Case{Isa::kAvx2, DType::kBF16},
                      Case{Isa::kAvx512, DType::kF32}, Case{Isa::kAvx512, DType::kF16},
                      Case{Isa::kAvx512, DType::kBF16}),
    CaseName);

// int8 weight-only matrices (QuantizeInt8): the quantization rule, and every kernel against
// a double reference and against the fp32 matrix of the same dequantized values: bit for bit
// for the portable and AVX2 kernels (they widen q * scale exactly and multiply as for fp32);
// the AVX-512 kernel sums x * q per sub-block and applies the scale once per sub-block
// (matmul_kernels.h), so it is held to the double reference's bound instead.
class Int8MatrixTest : public ::testing::TestWithParam<std::tuple<Isa, int>> {
 protected:
  void SetUp() override {
    if (SupportedIsa(std::get<0>(GetParam())) != std::get<0>(GetParam())) {
      GTEST_SKIP() << "this CPU cannot run the " << IsaName(std::get<0>(GetParam())) << " kernel";
    }
  }
};

// Weights [out, in] f32 whose rows span magnitudes from 1e-4 to 10 (so scales differ), with
// an all-zero row.
std::vector<float> SpreadWeights(int64_t out, int64_t in, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> w(out * in);
  for (int64_t o = 0; o < out; ++o) {
    const float mag = o == 3 ? 0.0f : std::pow(10.0f, static_cast<float>(o % 6) - 4.0f);
    for (int64_t k = 0; k < in; ++k) w[o * in + k] = mag * u(rng);
  }
  return w;
}

PackedMatrix Dequantized(const PackedMatrix& q) {
  std::vector<float> w(q.out() * q.in());
  for (int64_t o = 0; o < q.out(); ++o) {
    for (int64_t k = 0; k < q.in(); ++k) w[o * q.in() + k] = q.At(o, k);
  }
  return PackedMatrix::FromRows(w.data(), DType::kF32, q.out(), q.in(), DType::kF32);
}

TEST_P(Int8MatrixTest, QuantizesSymmetricallyPerGroup) {
  const int group = std::get<1>(GetParam());
  std::mt19937 rng(11);
  const int64_t out = 37, in = 2 * group + 5;  // a partial last group
  const std::vector<float> w = SpreadWeights(out, in, rng);
  const PackedMatrix m =
      PackedMatrix::QuantizeInt8({{w.data(), DType::kF32, out, false, in}}, in, group);
  ASSERT_EQ(m.int8_group(), group);
  ASSERT_EQ(m.num_groups(), 3);
  EXPECT_EQ(m.nbytes(), static_cast<size_t>(2 * 32 * (in + 2 * 3)));
  // The same matrix given column by column quantizes to the same bits.
  std::vector<float> cols(in * out);
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t k = 0; k < in; ++k) cols[k * out + o] = w[o * in + k];
  }
  const PackedMatrix c =
      PackedMatrix::QuantizeInt8({{cols.data(), DType::kF32, out, true, out}}, in, group);
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t g = 0; g * group < in; ++g) {
      float absmax = 0;
      for (int64_t k = g * group; k < std::min<int64_t>(in, (g + 1) * group); ++k) {
        absmax = std::max(absmax, std::abs(w[o * in + k]));
      }
      const uint16_t bits = FloatToBF16(absmax / 127.0f);
      const float scale = BF16ToFloat(bits);
      for (int64_t k = g * group; k < std::min<int64_t>(in, (g + 1) * group); ++k) {
        ASSERT_EQ(m.ScaleBitsAt(o, k), bits) << o << "," << k;
        const int want =
            scale == 0 ? 0 : std::clamp(static_cast<int>(std::nearbyint(w[o * in + k] / scale)), -127, 127);
        ASSERT_EQ(m.QuantAt(o, k), want) << o << "," << k;
        ASSERT_EQ(c.QuantAt(o, k), want) << o << "," << k;
        ASSERT_EQ(c.ScaleBitsAt(o, k), bits) << o << "," << k;
        // Within half a step, plus the scale's bf16 rounding at the group's largest value.
        ASSERT_LE(std::abs(m.At(o, k) - w[o * in + k]), 0.5f * scale + absmax * 0x1p-8f)
            << o << "," << k;
      }
    }
  }
}

TEST_P(Int8MatrixTest, MatchesTheDequantizedMatrix) {
  const auto [isa, group] = GetParam();
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const int64_t out : {1, 31, 33, 70}) {
    for (const int64_t in : {int64_t{1}, int64_t{group} - 1, int64_t{3} * group + 7, int64_t{300}}) {
      const std::vector<float> w = SpreadWeights(out, in, rng);
      const PackedMatrix m =
          PackedMatrix::QuantizeInt8({{w.data(), DType::kF32, out, false, in}}, in, group);
      const PackedMatrix f = Dequantized(m);
      std::vector<float> bias(out);
      for (float& b : bias) b = u(rng);
      for (const int64_t rows : {1, 2, 5, 12, 13, 25, 61}) {
        const int64_t ldx = in + 3, ldy = out + 5;
        std::vector<float> x(rows * ldx);
        for (float& v : x) v = u(rng);
        std::vector<float> y(rows * ldy, -7.0f), yf(rows * ldy, -7.0f);
        MatMul(x.data(), ldx, rows, m, bias.data(), y.data(), ldy, isa);
        MatMul(x.data(), ldx, rows, f, bias.data(), yf.data(), ldy, isa);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t o = isa == Isa::kAvx512 ? out : 0; o < ldy; ++o) {  // padding only
            ASSERT_EQ(y[r * ldy + o], yf[r * ldy + o])
                << "out " << out << " in " << in << " rows " << rows << " at " << r << "," << o;
          }
          for (int64_t o = 0; o < out; ++o) {
            double ref = bias[o], mag = std::abs(ref);
            for (int64_t k = 0; k < in; ++k) {
              const double p = static_cast<double>(x[r * ldx + k]) * m.At(o, k);
              ref += p;
              mag += std::abs(p);
            }
            ASSERT_NEAR(y[r * ldy + o], ref, 1e-6 * mag + 1e-7) << r << "," << o;
          }
        }
      }
    }
  }
}

TEST_P(Int8MatrixTest, RowsGiveTheSameBitsAloneAndInLargeProductsOnThreads) {
  const auto [isa, group] = GetParam();
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> u(-1, 1);
  const int64_t out = 300, in = 515, rows = 197;  // two row blocks, three column blocks
  const std::vector<float> w = SpreadWeights(out, in, rng);
  const PackedMatrix m =
      PackedMatrix::QuantizeInt8({{w.data(), DType::kF32, out, false, in}}, in, group);
  std::vector<float> x(rows * in);
  for (float& v : x) v = u(rng);
  std::vector<float> y(rows * out), ref(rows * out);
  MatMul(x.data(), in, rows, m, nullptr, y.data(), out, isa);
  for (int64_t r = 0; r < rows; ++r) {
    MatMul(&x[r * in], in, 1, m, nullptr, &ref[r * out], out, isa);
  }
  for (int64_t i = 0; i < rows * out; ++i) {
    ASSERT_EQ(y[i], ref[i]) << "row " << i / out << " output " << i % out;
  }
}

TEST_P(Int8MatrixTest, OneRowKernelGivesTheBitsOfEveryMultiRowPass) {
  const auto [isa, group] = GetParam();
  std::mt19937 rng(14);
  for (const int64_t in : {int64_t{1}, int64_t{group} + 5, int64_t{200}, int64_t{256},
                           int64_t{257}, int64_t{700}, int64_t{1027}}) {
    const int64_t out = 45;
    const std::vector<float> w = SpreadWeights(out, in, rng);
    ExpectOneRowBitsInEveryPassSize(
        PackedMatrix::QuantizeInt8({{w.data(), DType::kF32, out, false, in}}, in, group), isa,
        static_cast<uint32_t>(in));
  }
}

TEST(Int8GroupSizeTest, RefusesOtherGroupSizes) {
  const float w[4] = {1, 2, 3, 4};
  EXPECT_TRUE(PackedMatrix::QuantizeInt8({{w, DType::kF32, 1, false, 4}}, 4, 16).empty());
  EXPECT_FALSE(PackedMatrix::ValidInt8GroupSize(0));
  EXPECT_TRUE(PackedMatrix::ValidInt8GroupSize(64));
}

INSTANTIATE_TEST_SUITE_P(
    AllKernels, Int8MatrixTest,
    ::testing::Combine(::testing::Values(Isa::kPortable, Isa::kAvx2, Isa::kAvx512),
                       ::testing::Values(32, 64, 128)),
    [](const ::testing::TestParamInfo<std::tuple<Isa, int>>& info) {
      return std::string(IsaName(std::get<0>(info.param))) + "_g" +
             std::to_string(std::get<1>(info.param));
    });

TEST(CpuIsaTest, ParsesNamesAndClampsToTheCpu) {
  EXPECT_EQ(ParseIsa("avx512"), Isa::kAvx512);
  EXPECT_EQ(ParseIsa("avx2"), Isa::kAvx2);
  EXPECT_EQ(ParseIsa("portable"), Isa::kPortable);
  EXPECT_FALSE(ParseIsa("sse9").has_value());
  EXPECT_EQ(SupportedIsa(Isa::kPortable), Isa::kPortable);
  EXPECT_LE(static_cast<int>(SupportedIsa(Isa::kAvx512)), static_cast<int>(DetectedIsa()));
  EXPECT_LE(static_cast<int>(ActiveIsa()), static_cast<int>(DetectedIsa()));
}

}  // namespace
}  // namespace dcf::cpu
