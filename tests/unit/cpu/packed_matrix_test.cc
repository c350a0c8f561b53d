// The CPU matmul kernels (packed_matrix.h) against a plain double-precision reference, for
// every kernel this CPU can run (portable, avx2, avx512), every weight dtype, shapes that hit
// every row-block size and a partial last panel, strided x and y, with and without bias.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <omp.h>

#include "engine/cpu/cpu_isa.h"
#include "engine/cpu/matmul_kernels.h"
#include "engine/cpu/packed_matrix.h"
#include "engine/weights/int8_quant.h"
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

// Every pass size: 2-3 rows (the 1-3-row kernel), 4-13, 24, 25 (passes of up to 12 rows over
// whole panels, StreamsPanels in matmul_kernels.h, for every `in` below), 193-195 (a row
// block of 192 rows, passes over column blocks, then the 1-3-row kernel on the rest).
const std::vector<int64_t>& EveryPassSize() {
  static const std::vector<int64_t> rows = {2,  3,  4,  5,  6,  7,   8,   9,  10,
                                            11, 12, 13, 24, 25, 193, 194, 195};
  return rows;
}

// Rows of x, each multiplied alone (the 1-3-row kernel, its sub-blocks interleaved) and with
// the others of `row_counts` rows, must give the same bits: `in` covers a partial sub-block,
// 1-3 whole sub-blocks after the interleaved spans, and partial column blocks.
void ExpectOneRowBitsInEveryPassSize(const PackedMatrix& m, Isa isa, uint32_t seed,
                                     const std::vector<int64_t>& row_counts = EveryPassSize()) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  const int64_t in = m.in(), out = m.out();
  std::vector<float> bias(out);
  for (float& b : bias) b = u(rng);
  for (const int64_t rows : row_counts) {
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

// MatMul of `rows` random rows with `scratch` gives the bits of MatMul without one.
void ExpectScratchGivesTheSameBits(const PackedMatrix& m, int64_t rows, Isa isa,
                                   MatMulScratch* scratch, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1, 1);
  const int64_t in = m.in(), out = m.out();
  std::vector<float> x(rows * in), y(rows * out), want(rows * out);
  for (float& v : x) v = u(rng);
  MatMul(x.data(), in, rows, m, nullptr, want.data(), out, isa);
  MatMul(x.data(), in, rows, m, nullptr, y.data(), out, isa, scratch);
  for (int64_t i = 0; i < rows * out; ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(want[i]))
        << "in " << in << " rows " << rows << " at " << i;
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

// Row counts on both sides of StreamsPanels (matmul_kernels.h), whole panels and column
// blocks: 47 rows of 1027 columns pack all of x (4 passes), 48 are blocked; 12 rows of 8197
// columns pack more than the blocked kernel's buffer (kPackFloats), 13 are blocked.
struct PathCase {
  int64_t in;
  std::vector<int64_t> rows;
};
const std::vector<PathCase>& BothSidesOfWholePanels() {
  static const std::vector<PathCase> cases = {{1027, {47, 48}}, {8197, {12, 13}}};
  return cases;
}

TEST_P(PackedMatrixTest, WholePanelsAndColumnBlocksGiveTheBitsOfOneRow) {
  const auto [isa, dtype] = GetParam();
  std::mt19937 rng(6);
  for (const PathCase& c : BothSidesOfWholePanels()) {
    const int64_t out = 45;
    const std::vector<uint8_t> w = RandomWeights(dtype, out, c.in, rng);
    ExpectOneRowBitsInEveryPassSize(PackedMatrix::FromRows(w.data(), dtype, out, c.in, dtype),
                                    isa, static_cast<uint32_t>(c.in), c.rows);
  }
}

// Products split into chunks of several panels each (49 panels, the last partial, so a
// thread's chunks have first, inner and last panels; rows of y not starting on a cache line),
// more rows than one row block of the kernel (first, inner and last: AVX-512's kRowBlock,
// 390 = 192 + 192 + 6, and 200 = 192 + 8; the portable and AVX2 kernels' kGenericRowBlock,
// 102 = 48 + 48 + 6, its last block a pass of 4 rows and one of 2) and columns in two column
// blocks: the row blocks' and column blocks' offsets in x packed once for all threads, and
// the chunk's edge panels summed apart from y, give every row the bits of one row alone.
TEST_P(PackedMatrixTest, ChunksOfManyPanelsAndRowBlocksGiveTheBitsOfOneRow) {
  const auto [isa, dtype] = GetParam();
  std::mt19937 rng(7);
  const int64_t out = 48 * 32 + 24, in = 300;
  const std::vector<uint8_t> w = RandomWeights(dtype, out, in, rng);
  const std::vector<int64_t> rows =
      isa == Isa::kAvx512
          ? std::vector<int64_t>{5, 13, kernels::kRowBlock + 8, 2 * kernels::kRowBlock + 6}
          : std::vector<int64_t>{5, 13, 2 * kernels::kGenericRowBlock + 6};
  ExpectOneRowBitsInEveryPassSize(PackedMatrix::FromRows(w.data(), dtype, out, in, dtype), isa,
                                  8, rows);
}

// The same for float weights (what the AVX-512 kernel's threads pack x into): a reserved
// MatMulScratch gives the bits of the calling thread's own buffers, and products within the
// reservation (whole panels and column blocks, wide then narrow) never reallocate it.
TEST_P(PackedMatrixTest, ReservedScratchGivesTheSameBitsWithoutGrowing) {
  const auto [isa, dtype] = GetParam();
  std::mt19937 rng(9);
  const int64_t out = 300, widest = 700, most = 200;
  MatMulScratch scratch;
  scratch.Reserve(most, widest, 0, /*int8_activations=*/false);
  const float* const packed = scratch.xpacked.data();
  const size_t capacity = scratch.xpacked.capacity();
  for (const int64_t in : {widest, int64_t{300}}) {
    const std::vector<uint8_t> w = RandomWeights(dtype, out, in, rng);
    const PackedMatrix m = PackedMatrix::FromRows(w.data(), dtype, out, in, dtype);
    for (const int64_t rows : {int64_t{1}, int64_t{5}, int64_t{29}, most}) {
      ExpectScratchGivesTheSameBits(m, rows, isa, &scratch, rng);
      EXPECT_EQ(scratch.xpacked.data(), packed) << "reallocated";
    }
  }
  EXPECT_EQ(scratch.xpacked.capacity(), capacity);
  if (SupportedIsa(isa) == Isa::kAvx512 && omp_get_max_threads() > 1) {  // it was used
    EXPECT_GE(scratch.xpacked.size(), static_cast<size_t>(most * widest));
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
      PackedMatrix::QuantizeInt8({{w.data(), DType::kF32, out, false, in}}, in, {group});
  ASSERT_EQ(m.int8_group(), group);
  ASSERT_EQ(m.num_groups(), 3);
  EXPECT_EQ(m.nbytes(), static_cast<size_t>(2 * 32 * (in + 2 * 3)));
  // The same matrix given column by column quantizes to the same bits.
  std::vector<float> cols(in * out);
  for (int64_t o = 0; o < out; ++o) {
    for (int64_t k = 0; k < in; ++k) cols[k * out + o] = w[o * in + k];
  }
  const PackedMatrix c =
      PackedMatrix::QuantizeInt8({{cols.data(), DType::kF32, out, true, out}}, in, {group});
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
          PackedMatrix::QuantizeInt8({{w.data(), DType::kF32, out, false, in}}, in, {group});
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
      PackedMatrix::QuantizeInt8({{w.data(), DType::kF32, out, false, in}}, in, {group});
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
        PackedMatrix::QuantizeInt8({{w.data(), DType::kF32, out, false, in}}, in, {group}), isa,
        static_cast<uint32_t>(in));
  }
}

TEST_P(Int8MatrixTest, WholePanelsAndColumnBlocksGiveTheBitsOfOneRow) {
  const auto [isa, group] = GetParam();
  std::mt19937 rng(15);
  for (const PathCase& c : BothSidesOfWholePanels()) {
    const int64_t out = 45;
    const std::vector<float> w = SpreadWeights(out, c.in, rng);
    ExpectOneRowBitsInEveryPassSize(
        PackedMatrix::QuantizeInt8({{w.data(), DType::kF32, out, false, c.in}}, c.in, {group}),
        isa, static_cast<uint32_t>(c.in), c.rows);
  }
}

TEST(Int8GroupSizeTest, RefusesOtherGroupSizes) {
  const float w[4] = {1, 2, 3, 4};
  EXPECT_TRUE(PackedMatrix::QuantizeInt8({{w, DType::kF32, 1, false, 4}}, 4, {16}).empty());
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

// int8 x int8 matrices (QuantizeInt8 with int8 activations): x quantized per row and group,
// the integer sums of x_q * q exact, combined as matmul_kernels.h says. Every kernel must give
// the reference's bits (integer sums have no order), a row's bits must not depend on the
// batch, and the result must be within the activations' rounding of the weight-only product.
class Int8ActivationsTest : public ::testing::TestWithParam<std::tuple<Isa, int>> {
 protected:
  void SetUp() override {
    const Isa isa = std::get<0>(GetParam());
    if (SupportedIsa(isa) != isa) {
      GTEST_SKIP() << "this CPU cannot run the " << IsaName(isa) << " kernel";
    }
    if (isa == Isa::kAvx512 && !HasAvx512Vnni()) {
      GTEST_SKIP() << "no AVX-512 VNNI: the avx512 case would run the avx2 kernel";
    }
  }
};

PackedMatrix QuantizeA8(const std::vector<float>& w, int64_t out, int64_t in, int group) {
  return PackedMatrix::QuantizeInt8({{w.data(), DType::kF32, out, false, in}}, in, {group, true});
}

TEST(Int8ActivationRuleTest, QuantizesEachGroupToItsLargestMagnitude) {
  const int group = 32;
  const int64_t n = 2 * group + 3;  // a partial last group, padding to a multiple of 4
  std::vector<float> x(n);
  for (int64_t k = 0; k < n; ++k) x[k] = std::sin(0.37f * k) * (k < group ? 1.0f : 100.0f);
  x[group + 1] = 0.0f;
  for (int64_t k = 2 * group; k < n; ++k) x[k] = 0.0f;  // an all-zero group
  std::vector<uint8_t> u(RoundUpTo4(n) + 1, 0xAB);
  std::vector<float> scales(3, -1.0f);
  QuantizeActivationRowInt8(x.data(), n, group, u.data(), scales.data());
  for (int g = 0; g < 3; ++g) {
    float absmax = 0;
    for (int64_t k = g * group; k < std::min<int64_t>(n, (g + 1) * group); ++k) {
      absmax = std::max(absmax, std::abs(x[k]));
    }
    ASSERT_EQ(scales[g], absmax / 127.0f) << g;
    for (int64_t k = g * group; k < std::min<int64_t>(n, (g + 1) * group); ++k) {
      const int want = absmax == 0 ? 0 : static_cast<int>(std::nearbyint(x[k] * (127.0f / absmax)));
      ASSERT_EQ(static_cast<int>(u[k]) - 128, want) << k;
      ASSERT_LE(std::abs(want), 127);
      // Within half a step of x.
      ASSERT_LE(std::abs(want * scales[g] - x[k]), 0.5f * scales[g] * 1.0001f + 1e-30f) << k;
    }
  }
  for (int64_t k = n; k < RoundUpTo4(n); ++k) EXPECT_EQ(u[k], 128) << "padding " << k;
  EXPECT_EQ(u[RoundUpTo4(n)], 0xAB) << "wrote past the padded row";
  // The group's largest value maps to +-127; a non-finite value never becomes garbage.
  float y[4] = {2.0f, -2.0f, 1.0f, std::numeric_limits<float>::infinity()};
  uint8_t v[4];
  float s;
  QuantizeActivationRowInt8(y, 3, 32, v, &s);
  EXPECT_EQ(v[0], 128 + 127);
  EXPECT_EQ(v[1], 128 - 127);
  EXPECT_EQ(v[2], 128 + 64);  // 63.5 rounds half to even
  QuantizeActivationRowInt8(y, 4, 32, v, &s);
  EXPECT_EQ(v[3], 128) << "inf";
  // A subnormal group (127 / max |x| overflows) keeps the proportions: 2^-127 and its half
  // map to 127 and 64 (63.5, half to even), not both to 127.
  const float m = std::ldexp(1.0f, -127);
  const float tiny[4] = {m, m / 2, -m, 0.0f};
  QuantizeActivationRowInt8(tiny, 4, 32, v, &s);
  EXPECT_EQ(s, m / 127.0f);
  EXPECT_EQ(v[0], 128 + 127);
  EXPECT_EQ(v[1], 128 + 64);
  EXPECT_EQ(v[2], 128 - 127);
  EXPECT_EQ(v[3], 128);
}

// MatMul's AVX-512 quantizer against the rule it implements, bit for bit: every group size,
// row lengths with partial groups and 16-lane tails, and groups holding NaN, infinities,
// zeros only, subnormals (whose reciprocal overflows), exact half steps and huge values.
TEST(Int8ActivationRuleTest, Avx512QuantizerGivesTheBitsOfTheRule) {
  if (SupportedIsa(Isa::kAvx512) != Isa::kAvx512) GTEST_SKIP() << "no AVX-512";
  std::mt19937 rng(31);
  std::uniform_real_distribution<float> u(-1, 1);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float sub = std::ldexp(1.0f, -127);
  int cases = 0;
  for (const int group : {32, 64, 128}) {
    for (const int64_t n : {int64_t{1}, int64_t{5}, int64_t{16}, int64_t{17}, int64_t{group} - 1,
                            int64_t{group}, int64_t{3} * group + 7, int64_t{1027}}) {
      for (int trial = 0; trial < 12; ++trial) {
        std::vector<float> x(n);
        for (float& v : x) v = u(rng) * (trial % 3 == 0 ? 1e4f : 1.0f);
        const int64_t at = static_cast<int64_t>(rng() % n);
        switch (trial) {
          case 1: x[at] = nan; break;
          case 2: x[at] = inf; break;
          case 3: x[at] = -inf; x[(at + 1) % n] = nan; break;
          case 4: std::fill(x.begin(), x.end(), 0.0f); break;
          case 5: for (float& v : x) v *= sub; break;
          case 6:  // every group's max |x| is 127 (x * inv = x) and every other x a tie
            for (int64_t k = 0; k < n; ++k) {
              x[k] = k % group == 0 ? 127.0f : static_cast<float>(k % 254) - 126.5f;
            }
            break;
          case 7: x[at] = 3e38f; break;
          case 8: x[at] = -0.0f; break;
          default: break;
        }
        const int64_t padded = RoundUpTo4(n);
        const int64_t groups = (n + group - 1) / group;
        std::vector<uint8_t> want(padded + 1, 0xAB), got(padded + 1, 0xCD);
        std::vector<float> want_s(groups), got_s(groups);
        QuantizeActivationRowInt8(x.data(), n, group, want.data(), want_s.data());
        kernels::QuantizeActivationRowInt8Avx512(x.data(), n, group, got.data(), got_s.data());
        for (int64_t k = 0; k < padded; ++k) {
          ASSERT_EQ(got[k], want[k]) << "group " << group << " n " << n << " trial " << trial
                                     << " at " << k << " x " << (k < n ? x[k] : 0.0f);
        }
        ASSERT_EQ(got[padded], 0xCD) << "wrote past the padded row";
        for (int64_t g = 0; g < groups; ++g) {
          ASSERT_EQ(std::bit_cast<uint32_t>(got_s[g]), std::bit_cast<uint32_t>(want_s[g]))
              << "group " << group << " n " << n << " trial " << trial << " scale " << g;
        }
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 3 * 8 * 12);
}

TEST_P(Int8ActivationsTest, KeepsTheWeightOnlyQuantization) {
  const int group = std::get<1>(GetParam());
  std::mt19937 rng(21);
  for (const int64_t in : {int64_t{3}, int64_t{group}, int64_t{2} * group + 5}) {
    const int64_t out = 37;
    const std::vector<float> w = SpreadWeights(out, in, rng);
    const PackedMatrix a =
        PackedMatrix::QuantizeInt8({{w.data(), DType::kF32, out, false, in}}, in, {group});
    const PackedMatrix b = QuantizeA8(w, out, in, group);
    ASSERT_TRUE(b.int8_activations());
    ASSERT_FALSE(a.int8_activations());
    // Per panel: each group's q (columns rounded up to 4) plus 32 scales and 32 sums of q.
    int64_t bytes = 0;
    for (int64_t k0 = 0; k0 < in; k0 += group) {
      bytes += (std::min<int64_t>(group, in - k0) + 3) / 4 * 128 + 128;
    }
    EXPECT_EQ(b.nbytes(), static_cast<size_t>(2 * bytes)) << in;
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t k = 0; k < in; ++k) {
        ASSERT_EQ(b.QuantAt(o, k), a.QuantAt(o, k)) << o << "," << k;
        ASSERT_EQ(b.ScaleBitsAt(o, k), a.ScaleBitsAt(o, k)) << o << "," << k;
        ASSERT_EQ(b.At(o, k), a.At(o, k)) << o << "," << k;
      }
    }
  }
}

TEST_P(Int8ActivationsTest, GivesTheBitsOfTheIntegerReference) {
  const auto [isa, group] = GetParam();
  std::mt19937 rng(22);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const int64_t out : {1, 31, 33, 70}) {
    for (const int64_t in : {int64_t{1}, int64_t{group} - 1, int64_t{3} * group + 7,
                             int64_t{4} * group + 2, int64_t{300}}) {
      const std::vector<float> w = SpreadWeights(out, in, rng);
      const PackedMatrix m = QuantizeA8(w, out, in, group);
      std::vector<float> bias(out);
      for (float& b : bias) b = u(rng);
      for (const int64_t rows : {1, 2, 3, 4, 5, 7, 8, 9, 11, 12, 13, 29}) {
        const int64_t ldx = in + 3, ldy = out + 5;
        std::vector<float> x(rows * ldx);
        for (int64_t i = 0; i < rows * ldx; ++i) x[i] = u(rng) * (i % 5 == 0 ? 30.0f : 1.0f);
        for (const bool with_bias : {false, true}) {
          const float* b = with_bias ? bias.data() : nullptr;
          std::vector<float> y(rows * ldy, -7.0f);
          MatMul(x.data(), ldx, rows, m, b, y.data(), ldy, isa);
          std::vector<uint8_t> xq(RoundUpTo4(in));
          std::vector<float> xs(m.num_groups());
          for (int64_t r = 0; r < rows; ++r) {
            QuantizeActivationRowInt8(&x[r * ldx], in, group, xq.data(), xs.data());
            for (int64_t o = 0; o < out; ++o) {
              float want = b != nullptr ? b[o] : 0.0f;
              for (int64_t g = 0; g < m.num_groups(); ++g) {
                int64_t sum = 0;
                for (int64_t k = g * group; k < std::min<int64_t>(in, (g + 1) * group); ++k) {
                  sum += (static_cast<int64_t>(xq[k]) - 128) * m.QuantAt(o, k);
                }
                want = std::fma(static_cast<float>(sum),
                                xs[g] * BF16ToFloat(m.ScaleBitsAt(o, g * group)), want);
              }
              ASSERT_EQ(std::bit_cast<uint32_t>(y[r * ldy + o]), std::bit_cast<uint32_t>(want))
                  << "out " << out << " in " << in << " rows " << rows << " bias " << with_bias
                  << " at " << r << "," << o << ": " << y[r * ldy + o] << " vs " << want;
            }
            for (int64_t o = out; o < ldy; ++o) ASSERT_EQ(y[r * ldy + o], -7.0f) << "padding";
          }
        }
      }
    }
  }
}

TEST_P(Int8ActivationsTest, IsWithinTheActivationRoundingOfTheWeightOnlyProduct) {
  const auto [isa, group] = GetParam();
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> u(-1, 1);
  const int64_t out = 70, in = 3 * group + 7, rows = 9;
  const std::vector<float> w = SpreadWeights(out, in, rng);
  const PackedMatrix m = QuantizeA8(w, out, in, group);
  std::vector<float> x(rows * in);
  for (float& v : x) v = u(rng);
  std::vector<float> y(rows * out);
  MatMul(x.data(), in, rows, m, nullptr, y.data(), out, isa);
  double worst = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      // |x - x_q * s| <= s / 2 per column, s = the group's max |x| / 127.
      double ref = 0, bound = 1e-30;
      for (int64_t g = 0; g * group < in; ++g) {
        double absmax = 0;
        for (int64_t k = g * group; k < std::min<int64_t>(in, (g + 1) * group); ++k) {
          absmax = std::max(absmax, static_cast<double>(std::abs(x[r * in + k])));
        }
        for (int64_t k = g * group; k < std::min<int64_t>(in, (g + 1) * group); ++k) {
          ref += static_cast<double>(x[r * in + k]) * m.At(o, k);
          bound += 0.5 * absmax / 127.0 * std::abs(m.At(o, k)) * 1.001;
        }
      }
      ASSERT_LE(std::abs(y[r * out + o] - ref), bound) << r << "," << o;
      worst = std::max(worst, std::abs(y[r * out + o] - ref) / bound);
    }
  }
  // The rounding errors of many columns partly cancel: the worst case bound is loose, but a
  // product that ignored them (equal to the weight-only one) would give 0.
  EXPECT_GT(worst, 0.0);
}

// A NaN in x makes every output of its row NaN (as the fp32 product would), and only its
// row's; also when the product runs inside an OpenMP parallel region (one thread each).
TEST_P(Int8ActivationsTest, NaNReachesItsRowAndInsideParallelRegions) {
  const auto [isa, group] = GetParam();
  std::mt19937 rng(25);
  std::uniform_real_distribution<float> u(-1, 1);
  const int64_t out = 40, in = 2 * group + 3, rows = 5;
  const std::vector<float> w = SpreadWeights(out, in, rng);  // row 3 all zero
  const PackedMatrix m = QuantizeA8(w, out, in, group);
  std::vector<float> x(rows * in);
  for (float& v : x) v = u(rng);
  x[2 * in + group + 1] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> y(rows * out);
  MatMul(x.data(), in, rows, m, nullptr, y.data(), out, isa);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      ASSERT_EQ(std::isnan(y[r * out + o]), r == 2) << r << "," << o;
    }
  }
  std::vector<float> z(rows * out);
#pragma omp parallel for num_threads(2)
  for (int64_t r = 0; r < rows; ++r) {
    MatMul(&x[r * in], in, 1, m, nullptr, &z[r * out], out, isa);
  }
  for (int64_t i = 0; i < rows * out; ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(z[i]), std::bit_cast<uint32_t>(y[i])) << i;
  }
}

TEST_P(Int8ActivationsTest, OneRowKernelGivesTheBitsOfEveryMultiRowPass) {
  const auto [isa, group] = GetParam();
  std::mt19937 rng(24);
  for (const int64_t in : {int64_t{1}, int64_t{group} + 5, int64_t{256}, int64_t{257},
                           int64_t{1027}}) {
    const int64_t out = 45;
    const std::vector<float> w = SpreadWeights(out, in, rng);
    ExpectOneRowBitsInEveryPassSize(QuantizeA8(w, out, in, group), isa,
                                    static_cast<uint32_t>(in));
  }
}

// A reserved MatMulScratch (what CpuBackend::Prepare sets aside) gives the bits of the
// calling thread's own buffers, and products within the reservation never reallocate it.
TEST_P(Int8ActivationsTest, ReservedScratchGivesTheSameBitsWithoutGrowing) {
  const auto [isa, group] = GetParam();
  std::mt19937 rng(25);
  // 400 rows of at least 105 columns: quantized on the threads.
  const int64_t out = 70, widest = 3 * group + 9, most = 400;
  MatMulScratch scratch;
  scratch.Reserve(most, widest, group, /*int8_activations=*/true);
  const uint8_t* const xq = scratch.xq.data();
  const float* const xs = scratch.xs.data();
  const size_t xq_capacity = scratch.xq.capacity(), xs_capacity = scratch.xs.capacity();
  for (const int64_t in : {widest, int64_t{group} - 3}) {
    const PackedMatrix m = QuantizeA8(SpreadWeights(out, in, rng), out, in, group);
    for (const int64_t rows : {int64_t{1}, int64_t{5}, most}) {
      ExpectScratchGivesTheSameBits(m, rows, isa, &scratch, rng);
      EXPECT_EQ(scratch.xq.data(), xq) << "reallocated";
      EXPECT_EQ(scratch.xs.data(), xs) << "reallocated";
    }
  }
  EXPECT_EQ(scratch.xq.capacity(), xq_capacity);
  EXPECT_EQ(scratch.xs.capacity(), xs_capacity);
}

INSTANTIATE_TEST_SUITE_P(
    AllKernels, Int8ActivationsTest,
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
