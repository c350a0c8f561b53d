// Hand-checked cases for the CPU kernels: norms, activations, RoPE, compose, windowed
// attention.
#include <bit>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "engine/cpu/cpu_ops.h"
#include "engine/cpu/dcmha.h"
#include "engine/execution/step_plan.h"
#include "gtest/gtest.h"

namespace dcf::cpu {
namespace {

// The attention implementations this CPU can run: the portable reference, and AVX-512.
std::vector<Isa> TestIsas() {
  std::vector<Isa> isas = {Isa::kPortable};
  if (SupportedIsa(Isa::kAvx512) == Isa::kAvx512) isas.push_back(Isa::kAvx512);
  return isas;
}

TEST(NormTest, RmsNormHandCase) {
  const float x[4] = {1, 2, 3, 4};  // mean square 7.5
  const float w[4] = {1, 1, 2, 0.5f};
  float y[4];
  RmsNorm(x, w, 1, 4, 0.0, y);
  const float r = 1.0f / std::sqrt(7.5f);
  EXPECT_NEAR(y[0], 1 * r, 1e-6);
  EXPECT_NEAR(y[2], 3 * r * 2, 1e-6);
  EXPECT_NEAR(y[3], 4 * r * 0.5f, 1e-6);
  RmsNorm(x, w, 1, 4, 2.5, y);  // eps adds inside the sqrt
  EXPECT_NEAR(y[1], 2 / std::sqrt(10.0f), 1e-6);
}

TEST(NormTest, LayerNormHandCase) {
  const float x[8] = {1, 2, 3, 4, 10, 10, 10, 10};  // two rows
  const float w[4] = {1, 1, 1, 2};
  const float b[4] = {0, 0, 1, 0};
  float y[8];
  LayerNorm(x, w, b, 2, 4, 0.0, y);
  const float sd = std::sqrt(1.25f);  // var of 1..4
  EXPECT_NEAR(y[0], -1.5f / sd, 1e-6);
  EXPECT_NEAR(y[2], 0.5f / sd + 1, 1e-6);
  EXPECT_NEAR(y[3], 1.5f / sd * 2, 1e-6);
  LayerNorm(x, w, b, 2, 4, 1e-5, y);  // constant row: eps keeps it finite -> bias only
  EXPECT_NEAR(y[4], 0.0f, 1e-6);
  EXPECT_NEAR(y[6], 1.0f, 1e-6);
  EXPECT_NEAR(y[0], -1.5f / std::sqrt(1.25f + 1e-5f), 1e-6);
}

TEST(ActivationTest, GeluAndSilu) {
  EXPECT_NEAR(GeluErf(1.0f), 0.8413447f, 1e-6);
  EXPECT_NEAR(GeluErf(-1.0f), -0.1586553f, 1e-6);
  EXPECT_EQ(GeluErf(0.0f), 0.0f);
  EXPECT_NEAR(Silu(1.0f), 0.7310586f, 1e-6);
  EXPECT_NEAR(Silu(-2.0f), -0.2384058f, 1e-6);
}

// Distance in units in the last place between two finite floats of the same sign (or zero).
int64_t UlpDistance(float a, float b) {
  const auto key = [](float f) {
    const int32_t i = std::bit_cast<int32_t>(f);
    return i < 0 ? int64_t{INT32_MIN} - i : int64_t{i};
  };
  return std::abs(key(a) - key(b));
}

// SiluMul against the scalar Silu(g) * u it replaces: the portable level gives its bits; the
// AVX-512 one (its own exp) is within 4 ulp of them (the worst found is 4, at large negative
// g, where silu is about g exp(g)) over every 499th float of magnitude 1e-6 to 120 and both
// signs, every float of magnitude 87 to 89.5 (where expf leaves the normal floats and
// overflows), gives the bits of the special values (zeros, infinities, NaN), and handles
// tails of 1-15 elements.
TEST(ActivationTest, SiluMulMatchesTheScalarSilu) {
  std::vector<float> g;
  for (uint32_t bits = std::bit_cast<uint32_t>(1e-6f); bits <= std::bit_cast<uint32_t>(120.0f);
       bits += 499) {
    g.push_back(std::bit_cast<float>(bits));
    g.push_back(-std::bit_cast<float>(bits));
  }
  for (uint32_t bits = std::bit_cast<uint32_t>(87.0f); bits <= std::bit_cast<uint32_t>(89.5f);
       ++bits) {
    g.push_back(std::bit_cast<float>(bits));
    g.push_back(-std::bit_cast<float>(bits));
  }
  const float inf = std::numeric_limits<float>::infinity();
  for (const float v : {0.0f, -0.0f, 1e-30f, -1e-30f, 87.0f, -87.0f, 87.4f, -87.4f, 88.7f, -88.7f,
                        88.8f, -88.8f, 90.0f, -90.0f, 1e30f, -1e30f, inf, -inf,
                        std::numeric_limits<float>::denorm_min(),
                        -std::numeric_limits<float>::denorm_min(),
                        std::numeric_limits<float>::quiet_NaN(),
                        -std::numeric_limits<float>::quiet_NaN()}) {
    g.push_back(v);
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-3, 3);
  std::vector<float> u(g.size());
  for (float& v : u) v = dist(rng);
  for (const Isa isa : TestIsas()) {
    for (const int64_t n : {int64_t(g.size()), int64_t{1}, int64_t{15}, int64_t{17}}) {
      std::vector<float> out(n + 1, 42.0f), silu(n + 1, 42.0f);
      const std::vector<float> ones(n, 1.0f);
      SiluMul(g.data(), u.data(), out.data(), n, isa);
      SiluMul(g.data(), ones.data(), silu.data(), n, isa);
      EXPECT_EQ(out[n], 42.0f) << "wrote past n = " << n;
      int64_t worst = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float want = Silu(g[i]);
        ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(silu[i] * u[i]))
            << IsaName(isa) << " g " << g[i];
        if (std::isnan(want) || std::isinf(want) || want == 0.0f) {
          ASSERT_EQ(std::bit_cast<uint32_t>(silu[i]), std::bit_cast<uint32_t>(want))
              << IsaName(isa) << " g " << g[i];
          continue;
        }
        const int64_t d = UlpDistance(silu[i], want);
        if (isa == Isa::kPortable) {
          ASSERT_EQ(d, 0) << "g " << g[i];
        } else {
          ASSERT_LE(d, 4) << IsaName(isa) << " g " << g[i] << ": " << silu[i] << " vs " << want;
        }
        worst = std::max(worst, d);
      }
      if (n == int64_t(g.size())) {
        std::printf("%s: worst %lld ulp from the scalar Silu over %lld values\n", IsaName(isa),
                    static_cast<long long>(worst), static_cast<long long>(n));
      }
    }
  }
}

TEST(RopeTest, HalfPairingRotatesJWithJPlusHalf) {
  // r = 4: pairs (0, 2) with freq 1 and (1, 3) with freq base^-0.5.
  float x[6] = {1, 2, 3, 4, 5, 6};
  float c[2], s[2];
  RopeAngles(1, 4, 100.0, c, s);
  EXPECT_NEAR(c[0], std::cos(1.0), 1e-7);
  EXPECT_NEAR(s[1], std::sin(0.1), 1e-7);
  ApplyRope(x, 4, c, s);
  EXPECT_NEAR(x[0], 1 * std::cos(1.0) - 3 * std::sin(1.0), 1e-6);
  EXPECT_NEAR(x[2], 3 * std::cos(1.0) + 1 * std::sin(1.0), 1e-6);
  EXPECT_NEAR(x[1], 2 * std::cos(0.1) - 4 * std::sin(0.1), 1e-6);
  EXPECT_NEAR(x[3], 4 * std::cos(0.1) + 2 * std::sin(0.1), 1e-6);
  EXPECT_EQ(x[4], 5);  // partial rotary: dims >= r pass through
  EXPECT_EQ(x[5], 6);
  RopeAngles(0, 4, 100.0, c, s);  // position 0 is the identity
  float y[4] = {1, 2, 3, 4};
  ApplyRope(y, 4, c, s);
  EXPECT_EQ(y[0], 1);
  EXPECT_EQ(y[3], 4);
}

TEST(ComposeTest, HandCaseWithTwoHeads) {
  // N = 2, I = 2. Query: W1 = [[1,0],[0,1]], W2 = [[1,2],[0,0]], G = [0.5, 0].
  // Key: W1 = [[1,1],[0,0]], W2 = [[0,0],[0,1]], G = [0, -1].
  const float qw[8] = {1, 0, 0, 1, /*W2*/ 1, 2, 0, 0};
  const float qg[2] = {0.5f, 0};
  const float kw[8] = {1, 1, 0, 0, /*W2*/ 0, 0, 0, 1};
  const float kg[2] = {0, -1};
  const float s[2] = {2, 3};
  float out[2];
  Compose(2, qw, qg, kw, kg, s, out);
  // <W1q0,s>=2, <W1q1,s>=3, <W1k0,s>=5, <W1k1,s>=0
  // out0 = 2*(1+0.5+0) + (1*2 + 0*3) + (0*5 + 0*0) = 5
  // out1 = 3*(1+0-1) + (2*2 + 0*3) + (0*5 + 1*0) = 4
  EXPECT_FLOAT_EQ(out[0], 5);
  EXPECT_FLOAT_EQ(out[1], 4);
  float inplace[2] = {2, 3};
  Compose(2, qw, qg, kw, kg, inplace, inplace);  // aliasing allowed
  EXPECT_FLOAT_EQ(inplace[0], 5);
  EXPECT_FLOAT_EQ(inplace[1], 4);
}

// With all compose terms zero, DCMHA is plain softmax attention; keys outside [lo, hi] must
// have no influence at all.
TEST(AttendOneTest, ZeroComposeIsSoftmaxAttentionAndWindowMasksKeys) {
  const int N = 2, hd = 2;
  const KvRowLayout layout(N, hd);
  const int row = layout.row_floats();
  const int P = 4;
  std::vector<float> rows(P * row, 0.0f);
  const float k[P][4] = {{9, 9, 9, 9}, {1, 0, 0, 1}, {0, 1, 1, 0}, {1, 1, -1, 0}};
  const float v[P][4] = {{1e6, 1e6, 1e6, 1e6}, {1, 2, 3, 4}, {5, 6, 7, 8}, {-1, 0, 2, 1}};
  for (int p = 0; p < P; ++p) {
    std::copy(k[p], k[p] + 4, &rows[p * row + layout.k_offset()]);
    std::copy(v[p], v[p] + 4, &rows[p * row + layout.v_offset()]);
  }
  // Two segments, as a paged cache plus fresh rows would give them.
  const KeySegment segs[2] = {{0, 2, rows.data(), row}, {2, 2, rows.data() + 2 * row, row}};
  const float q[4] = {0.5f, 1.0f, -1.0f, 2.0f};
  const std::vector<float> zeros(4 * N, 0.0f);
  QueryInputs qi{q, zeros.data(), zeros.data(), zeros.data(), zeros.data()};
  std::vector<float> scratch(AttendScratchFloats(layout, P));
  for (Isa isa : TestIsas()) {
  SCOPED_TRACE(IsaName(isa));
  float out[4];
  AttendOne(layout, qi, segs, /*lo=*/1, /*hi=*/3, scratch.data(), out, isa);
  for (int n = 0; n < N; ++n) {
    double sc[3], mx = -1e30, sum = 0;
    for (int p = 1; p < P; ++p) {
      sc[p - 1] = (q[n * 2] * k[p][n * 2] + q[n * 2 + 1] * k[p][n * 2 + 1]) / std::sqrt(2.0);
      mx = std::max(mx, sc[p - 1]);
    }
    for (double& x : sc) sum += (x = std::exp(x - mx));
    for (int d = 0; d < hd; ++d) {
      double want = 0;
      for (int p = 1; p < P; ++p) want += sc[p - 1] / sum * v[p][n * 2 + d];
      EXPECT_NEAR(out[n * hd + d], want, 1e-5) << n << "," << d;
    }
  }
  }
}

// With compose switched off (benchmarks' plain MHA), non-zero compose terms have no effect:
// the result equals attention with all terms zero.
TEST(AttendOneTest, ComposeOffIgnoresTheTerms) {
  const int N = 2, hd = 2;
  const KvRowLayout layout(N, hd);
  const int row = layout.row_floats();
  const int P = 3;
  std::vector<float> rows(P * row), zero_terms(P * row);
  for (int i = 0; i < P * row; ++i) rows[i] = std::sin(0.7f * i);
  zero_terms = rows;
  for (int p = 0; p < P; ++p) {
    for (int i = layout.terms_offset(); i < row; ++i) zero_terms[p * row + i] = 0;
  }
  const float q[4] = {0.5f, 1.0f, -1.0f, 2.0f};
  std::vector<float> terms(4 * N);
  for (int i = 0; i < 4 * N; ++i) terms[i] = 0.3f * i - 1;
  const std::vector<float> zeros(4 * N, 0.0f);
  QueryInputs off{q, terms.data(), terms.data(), terms.data(), terms.data(), /*compose=*/false};
  QueryInputs plain{q, zeros.data(), zeros.data(), zeros.data(), zeros.data()};
  std::vector<float> scratch(AttendScratchFloats(layout, P));
  const KeySegment with_terms[1] = {{0, P, rows.data(), row}};
  const KeySegment without[1] = {{0, P, zero_terms.data(), row}};
  for (Isa isa : TestIsas()) {
    float a[4], b[4];
    AttendOne(layout, off, with_terms, 0, P - 1, scratch.data(), a, isa);
    AttendOne(layout, plain, without, 0, P - 1, scratch.data(), b, isa);
    for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(a[i], b[i]) << IsaName(isa) << " " << i;
  }
}

// Post-compose acts on normalised probabilities, with no renormalisation afterwards: with
// a key-side G of g on every key, the output is (1 + g) times plain attention.
TEST(AttendOneTest, PostComposeScalesProbabilitiesWithoutRenormalising) {
  const int N = 1, hd = 1;
  const KvRowLayout layout(N, hd);
  const int row = layout.row_floats();
  std::vector<float> rows(2 * row, 0.0f);
  rows[0 * row + layout.k_offset()] = 1;
  rows[1 * row + layout.k_offset()] = -1;
  rows[0 * row + layout.v_offset()] = 2;
  rows[1 * row + layout.v_offset()] = 4;
  const int g_offset = layout.branch_offset(1) + 2 * 2 * N;  // after W1, W2 of branch 1
  rows[0 * row + g_offset] = 0.5f;
  rows[1 * row + g_offset] = 0.5f;
  const KeySegment seg{0, 2, rows.data(), row};
  const float q[1] = {1};
  const std::vector<float> zeros(4, 0.0f);
  QueryInputs qi{q, zeros.data(), zeros.data(), zeros.data(), zeros.data()};
  std::vector<float> scratch(AttendScratchFloats(layout, 2));
  const double e0 = std::exp(1.0), e1 = std::exp(-1.0);
  for (Isa isa : TestIsas()) {
    float out[1];
    AttendOne(layout, qi, {&seg, 1}, 0, 1, scratch.data(), out, isa);
    EXPECT_NEAR(out[0], 1.5 * (2 * e0 + 4 * e1) / (e0 + e1), 1e-5) << IsaName(isa);
  }
}

// The AVX-512 attention against the portable one on random inputs: head counts below, at and
// above one vector (1, 8, 16, 20, 32), head dims with and without a partial vector, several
// segments, windows, compose on and off.
TEST(AttendOneTest, VectorisedMatchesPortable) {
  if (SupportedIsa(Isa::kAvx512) != Isa::kAvx512) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const int N : {1, 8, 16, 20, 32}) {
    for (const int hd : {1, 8, 16, 20, 64, 80, 128}) {
      const KvRowLayout layout(N, hd);
      const int row = layout.row_floats();
      const int P = 37;
      std::vector<float> rows(P * row);
      for (float& x : rows) x = u(rng);
      std::vector<float> q(N * hd), terms(4 * 5 * N);
      for (float& x : q) x = 2 * u(rng);
      for (float& x : terms) x = 0.5f * u(rng);
      const float* pre_w = terms.data();
      const float* post_w = terms.data() + 10 * N;
      QueryInputs qi{q.data(), pre_w, pre_w + 4 * N, post_w, post_w + 4 * N};
      // Keys 0..36 in three segments laid out in different places.
      const KeySegment segs[3] = {{0, 16, rows.data(), row},
                                  {16, 5, rows.data() + 16 * row, row},
                                  {21, 16, rows.data() + 21 * row, row}};
      std::vector<float> scratch(AttendScratchFloats(layout, P));
      for (const bool compose : {true, false}) {
        qi.compose = compose;
        for (const auto& [lo, hi] : {std::pair{0, 36}, std::pair{0, 0}, std::pair{14, 30}}) {
          std::vector<float> want(N * hd), got(N * hd);
          AttendOne(layout, qi, segs, lo, hi, scratch.data(), want.data(), Isa::kPortable);
          AttendOne(layout, qi, segs, lo, hi, scratch.data(), got.data(), Isa::kAvx512);
          for (int i = 0; i < N * hd; ++i) {
            ASSERT_NEAR(got[i], want[i], 2e-5 * (1 + std::abs(want[i])))
                << "N " << N << " hd " << hd << " compose " << compose << " keys " << lo << ".."
                << hi << " at " << i;
          }
        }
      }
    }
  }
}

// 16-bit cache rows (bfloat16, float16) are widened exactly as they are read: attending over
// them is bit-identical to attending over f32 rows holding the widened values, on every ISA,
// and the AVX-512 kernel agrees with the portable one on them (as on f32 rows).
TEST(AttendOneTest, SixteenBitRowsEqualTheirWidenedFloatRows) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const DType dtype : {DType::kBF16, DType::kF16}) {
    for (const int N : {1, 16, 20}) {
      for (const int hd : {8, 20, 64, 128}) {
        const KvRowLayout layout(N, hd);
        const int row = layout.row_floats();
        const int P = 29;
        std::vector<uint16_t> rows16(P * row);
        std::vector<float> widened(P * row);
        for (int i = 0; i < P * row; ++i) {
          // Small values too (float16 subnormals), and zeros.
          const float x = i % 97 == 0 ? 0.0f : u(rng) * (i % 13 == 0 ? 1e-5f : 1.0f);
          rows16[i] = dtype == DType::kBF16 ? FloatToBF16(x) : FloatToHalf(x);
          widened[i] = dtype == DType::kBF16 ? BF16ToFloat(rows16[i]) : HalfToFloat(rows16[i]);
        }
        std::vector<float> q(N * hd), terms(4 * 5 * N);
        for (float& x : q) x = 2 * u(rng);
        for (float& x : terms) x = 0.5f * u(rng);
        const float* pre_w = terms.data();
        const float* post_w = terms.data() + 10 * N;
        const QueryInputs qi{q.data(), pre_w, pre_w + 4 * N, post_w, post_w + 4 * N};
        const KeySegment segs16[2] = {{0, 11, rows16.data(), row, dtype},
                                      {11, 18, rows16.data() + 11 * row, row, dtype}};
        const KeySegment segs32[2] = {{0, 11, widened.data(), row},
                                      {11, 18, widened.data() + 11 * row, row}};
        std::vector<float> scratch(AttendScratchFloats(layout, P));
        std::vector<float> portable(N * hd);
        for (const Isa isa : TestIsas()) {
          for (const auto& [lo, hi] : {std::pair{0, 28}, std::pair{5, 20}}) {
            std::vector<float> a(N * hd), b(N * hd);
            AttendOne(layout, qi, segs16, lo, hi, scratch.data(), a.data(), isa);
            AttendOne(layout, qi, segs32, lo, hi, scratch.data(), b.data(), isa);
            for (int i = 0; i < N * hd; ++i) {
              ASSERT_EQ(a[i], b[i]) << DTypeName(dtype) << " " << IsaName(isa) << " N " << N
                                    << " hd " << hd << " keys " << lo << ".." << hi << " at "
                                    << i;
            }
            if (lo != 0) continue;
            if (isa == Isa::kPortable) {
              portable = a;
            } else {
              for (int i = 0; i < N * hd; ++i) {
                ASSERT_NEAR(a[i], portable[i], 2e-5 * (1 + std::abs(portable[i])))
                    << DTypeName(dtype) << " N " << N << " hd " << hd << " at " << i;
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace dcf::cpu
