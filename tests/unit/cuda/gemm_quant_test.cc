// The library path of quantized weights (gemm_quant.h, quant_kernels.h): its kernels bit for
// bit against host references of their rules; Gemm::Linear with int8 / fp8 weights (more
// rows than the GEMV takes) against double references, weight-only and with fp8
// activations, across panel boundaries; the FP8 GEMM's compute-capability rule and the
// refusals.
#include <cmath>
#include <cstring>
#include <limits>

#include "engine/cuda/gemm_quant.h"
#include "engine/cuda/quant_kernels.h"
#include "gtest/gtest.h"
#include "tests/unit/cuda/quant_test_util.h"

namespace dcf::cuda_test {
namespace {

using cuda::ElemType;
using cuda::WeightType;

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

TEST(QuantKernelsTest, QuantizeRowsFp8FollowsTheRule) {
  for (const ElemType type : {ElemType::kF32, ElemType::kBF16, ElemType::kF16}) {
    const int rows = 5, k = 300, ldx = 304, ldq = 320;
    std::vector<float> x = RoundTo(RandomVector(static_cast<size_t>(rows) * ldx, 61, -3, 3), type);
    for (int i = 0; i < ldx; ++i) x[1 * ldx + i] = 0.0f;  // a zero row
    x[2 * ldx + 7] = std::numeric_limits<float>::quiet_NaN();  // NaN stays NaN
    for (int i = 0; i < ldx; ++i) x[3 * ldx + i] *= 1e-37f;  // 448 / amax overflows
    x = RoundTo(x, type);
    TypedBuffer dx(x, type);
    DeviceBuffer<uint8_t> q(static_cast<size_t>(rows) * ldq);
    DeviceBuffer<float> scale(rows);
    cuda::QuantizeRowsFp8Params p;
    p.rows = rows;
    p.k = k;
    p.x = dx.get();
    p.ldx = ldx;
    p.dtype = type;
    p.q = q.get();
    p.ldq = ldq;
    p.x_scale = scale.get();
    ASSERT_TRUE(CudaOk(cuda::LaunchQuantizeRowsFp8(p, nullptr)));
    ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
    const std::vector<uint8_t> got = q.ToHost();
    const std::vector<float> got_scale = scale.ToHost();
    for (int r = 0; r < rows; ++r) {
      float amax = 0;
      for (int i = 0; i < k; ++i) amax = std::fmax(amax, std::fabs(x[r * ldx + i]));
      const float inv = amax > 0 ? 448.0f / amax : 0.0f;
      EXPECT_EQ(Bits(got_scale[r]), Bits(amax / 448.0f)) << TypeName(type) << " row " << r;
      for (int i = 0; i < ldq; ++i) {
        uint8_t want = 0;
        const float v = i < k ? x[r * ldx + i] : 0.0f;
        if (i < k && std::isnan(v)) {
          want = 0x7f;
        } else if (i < k && amax > 0) {
          want = FloatToFp8E4M3(std::isinf(inv) ? MulRounded(v / amax, 448.0f)
                                                : MulRounded(v, inv));
        }
        ASSERT_EQ(got[r * ldq + i], want) << TypeName(type) << " row " << r << " col " << i;
      }
    }
    EXPECT_EQ(got_scale[1], 0.0f);
    EXPECT_EQ(got[2 * ldq + 7], 0x7f);
    // The tiny row still reaches +-448 (f16 has no values that small: a zero row there).
    bool reaches_max = false;
    for (int i = 0; i < k; ++i) reaches_max |= (got[3 * ldq + i] & 0x7f) == 0x7e;
    EXPECT_EQ(reaches_max, type != ElemType::kF16);
  }
}

TEST(QuantKernelsTest, DequantRowsIsExact) {
  const int rows = 7, k = 129;
  for (const WeightType wt : {WeightType::kI8, WeightType::kFp8}) {
    const HostQuantMatrix w = QuantizeMatrix(RandomVector(rows * k, 62), rows, k, wt);
    for (const ElemType type : {ElemType::kF32, ElemType::kBF16, ElemType::kF16}) {
      DeviceBuffer<uint8_t> codes(w.codes);
      TypedBuffer out(static_cast<size_t>(rows) * k, type);
      cuda::DequantRowsParams p;
      p.rows = rows;
      p.k = k;
      p.w = codes.get();
      p.wtype = wt;
      p.out = out.get();
      p.dtype = type;
      ASSERT_TRUE(CudaOk(cuda::LaunchDequantRows(p, nullptr)));
      ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
      const std::vector<float> got = out.ToHost();
      EXPECT_EQ(0, std::memcmp(got.data(), w.values.data(), got.size() * sizeof(float)))
          << WeightName(wt) << " to " << TypeName(type);
    }
  }
}

TEST(QuantKernelsTest, ScaleEpilogueFollowsTheRule) {
  const int rows = 6, cols = 50, lds = 64, ldy = 52;
  const std::vector<float> sums = RandomVector(rows * lds, 63, -50, 50);
  const std::vector<float> ws = RandomVector(cols, 64, 0.001f, 0.01f);
  const std::vector<float> xs = RandomVector(rows, 65, 0.01f, 0.1f);
  const std::vector<float> bias = RandomVector(cols, 66);
  const std::vector<float> y0 = RandomVector(rows * ldy, 67);
  for (const bool with_x : {false, true}) {
    for (const bool accumulate : {false, true}) {
      DeviceBuffer<float> ds(sums), dws(ws), dxs(xs), db(bias), dy(y0);
      cuda::ScaleEpilogueParams p;
      p.rows = rows;
      p.cols = cols;
      p.sums = ds.get();
      p.lds = lds;
      p.w_scale = dws.get();
      p.x_scale = with_x ? dxs.get() : nullptr;
      p.bias = db.get();
      p.y = dy.get();
      p.ldy = ldy;
      p.accumulate = accumulate;
      ASSERT_TRUE(CudaOk(cuda::LaunchScaleEpilogue(p, nullptr)));
      ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
      const std::vector<float> got = dy.ToHost();
      std::vector<float> want = y0;
      for (int r = 0; r < rows; ++r) {
        for (int c = 0; c < cols; ++c) {
          float v = sums[r * lds + c];
          if (with_x) v = MulRounded(v, xs[r]);
          v = MulRounded(v, ws[c]) + bias[c];
          want[r * ldy + c] = accumulate ? y0[r * ldy + c] + v : v;
        }
      }
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
          << "x scales " << with_x << " accumulate " << accumulate;
    }
  }
}

struct Shape {
  int m, n, k;
  int64_t ldx, ldy;
  bool bias, accumulate;
};

using Param = std::tuple<WeightType, ElemType>;

class GemmQuantTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override { cuda::SetQuantPanelForTesting(int64_t{32} << 10, 16); }
  void TearDown() override { cuda::SetQuantPanelForTesting(int64_t{32} << 20, 256); }
  WeightType wtype() const { return std::get<0>(GetParam()); }
  ElemType type() const { return std::get<1>(GetParam()); }
};

// Weight-only (and, for fp8 weights, fp8 activations): panels of 32 KiB, so that every
// product but the smallest crosses panel boundaries (offsets of codes, scales, bias and y).
TEST_P(GemmQuantTest, LinearMatchesTheReference) {
  auto gemm = cuda::Gemm::Create(size_t{4} << 20);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  ASSERT_TRUE((*gemm)->fp8_gemm_supported());  // the emulator is a 9.0 device
  for (const Shape s : {Shape{17, 96, 64, 64, 96, false, false},     // one panel
                        Shape{20, 700, 256, 264, 704, true, true},   // several, + a partial one
                        Shape{33, 128, 80, 80, 136, true, false},
                        Shape{33, 130, 80, 80, 136, true, false},  // N not a multiple of 16
                        Shape{19, 40, 37, 41, 44, true, true}}) {  // K not a multiple of 16
    for (const bool fp8_flag : {false, true}) {
      if (fp8_flag && wtype() != WeightType::kFp8) continue;
      // The FP8 GEMM needs K and N multiples of 16; other products run weight-only.
      const bool fp8_x = fp8_flag && s.k % 16 == 0 && s.n % 16 == 0;
      SCOPED_TRACE(testing::Message() << "m=" << s.m << " n=" << s.n << " k=" << s.k
                                      << (fp8_flag ? " fp8 activations" : ""));
      const std::vector<float> x = RoundTo(RandomVector(s.m * s.ldx, 71), type());
      const HostQuantMatrix w =
          QuantizeMatrix(RandomVector(static_cast<size_t>(s.n) * s.k, 72), s.n, s.k, wtype());
      const std::vector<float> bias = RandomVector(s.n, 73);
      const std::vector<float> y0 = RandomVector(s.m * s.ldy, 74);
      TypedBuffer dx(x, type());
      DeviceQuantMatrix dw(w);
      DeviceBuffer<float> db(bias), dy(y0);
      cuda::GemmArgs a;
      a.m = s.m;
      a.n = s.n;
      a.k = s.k;
      a.x = dx.get();
      a.ldx = s.ldx;
      a.w = dw.codes.get();
      a.dtype = type();
      a.wtype = wtype();
      a.w_scale = dw.scale.get();
      a.fp8_activations = fp8_flag;
      a.bias = s.bias ? db.get() : nullptr;
      a.y = dy.get();
      a.ldy = s.ldy;
      a.accumulate = s.accumulate;
      EXPECT_EQ(cuda::UsesFp8Gemm(a), fp8_x);
      ASSERT_TRUE((*gemm)->Linear(a, nullptr).ok());
      ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
      const std::vector<float> got = dy.ToHost();
      const std::vector<float> weight_only = QuantLinearWant(
          x, w, s.bias ? bias.data() : nullptr, y0, s.m, s.ldx, s.ldy, s.accumulate);
      if (!fp8_x) {
        // Exact decode, f32 sums: the rounding of f32 accumulation only.
        EXPECT_LT(Nmse(got, weight_only), 1e-10);
        EXPECT_LT(MaxAbs(got, weight_only), 1e-4);
      } else {
        // The rule of fp8 activations in double: x's codes times the weights' codes, then
        // both scales.
        std::vector<float> xv, xs;
        QuantizeActivationsFp8(x, s.m, s.k, s.ldx, &xv, &xs);
        std::vector<float> want = y0;
        for (int r = 0; r < s.m; ++r) {
          for (int c = 0; c < s.n; ++c) {
            double sum = 0;
            for (int i = 0; i < s.k; ++i) {
              sum += double{xv[r * s.k + i]} * w.values[static_cast<size_t>(c) * s.k + i];
            }
            const double v = sum * xs[r] * w.scale[c] + (s.bias ? bias[c] : 0.0);
            float& y = want[r * s.ldy + c];
            y = static_cast<float>(s.accumulate ? y + v : v);
          }
        }
#if defined(DCF_CUDA_SIM)
        // The emulator's FP8 GEMM widens the codes and sums in f32.
        EXPECT_LT(Nmse(got, want), 1e-10);
        EXPECT_LT(MaxAbs(got, want), 1e-4);
#else
        // Hopper's FP8 tensor cores add with about 14 bits between cuBLASLt's promotions to
        // f32 (an NMSE near 1e-8 estimated): the bound is the products' rounding, not f32's.
        EXPECT_LT(Nmse(got, want), 1e-6);
        EXPECT_LT(MaxAbs(got, want), 1e-2);
#endif
        // And near the weight-only product: E4M3 keeps 3 mantissa bits of each x.
        EXPECT_LT(Nmse(got, weight_only), 2e-3);
        EXPECT_GT(MaxAbs(got, weight_only), 1e-6);  // it did quantize x
      }
      EXPECT_GT(MaxAbs(got, y0), 0.1);
    }
  }
  EXPECT_GT((*gemm)->quant_workspace_bytes(), 0u);
}

// Prepare sizes the workspace and the plans of every library product of a quantized one, so
// that a step within the limits builds and allocates nothing.
TEST_P(GemmQuantTest, PrepareCoversTheLibraryProducts) {
  auto gemm = cuda::Gemm::Create(size_t{4} << 20);
  ASSERT_TRUE(gemm.ok());
  const Shape s{40, 300, 96, 96, 300, true, false};
  const HostQuantMatrix w =
      QuantizeMatrix(RandomVector(static_cast<size_t>(s.n) * s.k, 75), s.n, s.k, wtype());
  TypedBuffer dx(RandomVector(s.m * s.ldx, 76), type());
  DeviceQuantMatrix dw(w);
  DeviceBuffer<float> db(RandomVector(s.n, 77)), dy(static_cast<size_t>(s.m) * s.ldy);
  cuda::GemmArgs a;
  a.m = s.m;
  a.n = s.n;
  a.k = s.k;
  a.x = dx.get();
  a.ldx = s.ldx;
  a.w = dw.codes.get();
  a.dtype = type();
  a.wtype = wtype();
  a.w_scale = dw.scale.get();
  a.fp8_activations = wtype() == WeightType::kFp8;
  a.bias = db.get();
  a.y = dy.get();
  a.ldy = s.ldy;
  ASSERT_TRUE((*gemm)->Prepare({a}, 17, nullptr).ok());
  const size_t workspace = (*gemm)->quant_workspace_bytes();
  const int pinned = (*gemm)->stats().pinned_plans;
  EXPECT_GT(pinned, 0);
  for (const int m : {17, 25, 40}) {
    cuda::GemmArgs at = a;
    at.m = m;
    ASSERT_TRUE((*gemm)->Linear(at, nullptr).ok());
  }
  ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
  EXPECT_EQ((*gemm)->stats().plans_built_on_use, 0);
  EXPECT_EQ((*gemm)->quant_workspace_bytes(), workspace);
}

INSTANTIATE_TEST_SUITE_P(
    Types, GemmQuantTest,
    ::testing::Combine(::testing::Values(WeightType::kI8, WeightType::kFp8),
                       ::testing::Values(ElemType::kF32, ElemType::kBF16, ElemType::kF16)),
    [](const auto& info) {
      return std::string(WeightName(std::get<0>(info.param))) + "_" +
             TypeName(std::get<1>(info.param));
    });

TEST(GemmQuant, Fp8GemmNeedsComputeCapability89) {
  EXPECT_EQ(cuda::Fp8GemmSupport(8, 0).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cuda::Fp8GemmSupport(8, 6).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(cuda::Fp8GemmSupport(8, 0).message().find("sm_80"), absl::string_view::npos);
  EXPECT_TRUE(cuda::Fp8GemmSupport(8, 9).ok());
  EXPECT_TRUE(cuda::Fp8GemmSupport(9, 0).ok());
  EXPECT_TRUE(cuda::Fp8GemmSupport(10, 0).ok());
}

TEST(GemmQuant, RefusesWhatItCannotRun) {
  auto gemm = cuda::Gemm::Create(0);
  ASSERT_TRUE(gemm.ok());
  DeviceBuffer<float> buf(4096);
  cuda::GemmArgs a;
  a.m = 20;
  a.n = 16;
  a.k = 16;
  a.x = buf.get();
  a.ldx = 16;
  a.w = buf.get();
  a.y = buf.get();
  a.ldy = 16;
  a.wtype = WeightType::kFp8;  // no scales
  EXPECT_EQ((*gemm)->Linear(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
  a.wtype = WeightType::kI8;
  a.w_scale = buf.get();
  a.fp8_activations = true;  // int8 weights
  EXPECT_EQ((*gemm)->Linear(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
  a.wtype = WeightType::kDense;  // a dense matrix with scales
  a.fp8_activations = false;
  EXPECT_EQ((*gemm)->Linear(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

#if defined(DCF_CUDA_SIM)
// An emulated sm_80: fp8 weights still run (weight-only), fp8 activations are refused.
TEST(GemmQuant, Fp8ActivationsAreRefusedBelowComputeCapability89) {
  simt::SetComputeCapability(8, 0);
  auto gemm = cuda::Gemm::Create(0);
  simt::SetComputeCapability(9, 0);
  ASSERT_TRUE(gemm.ok());
  EXPECT_FALSE((*gemm)->fp8_gemm_supported());
  const int m = 20, n = 16, k = 32;
  const HostQuantMatrix w = QuantizeMatrix(RandomVector(n * k, 78), n, k, WeightType::kFp8);
  TypedBuffer dx(RandomVector(m * k, 79), ElemType::kBF16);
  DeviceQuantMatrix dw(w);
  DeviceBuffer<float> dy(m * n);
  cuda::GemmArgs a;
  a.m = m;
  a.n = n;
  a.k = k;
  a.x = dx.get();
  a.ldx = k;
  a.w = dw.codes.get();
  a.dtype = ElemType::kBF16;
  a.wtype = WeightType::kFp8;
  a.w_scale = dw.scale.get();
  a.y = dy.get();
  a.ldy = n;
  EXPECT_TRUE((*gemm)->Linear(a, nullptr).ok());
  a.fp8_activations = true;
  EXPECT_EQ((*gemm)->Linear(a, nullptr).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*gemm)->Prepare({a}, 17, nullptr).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
}
#endif

}  // namespace
}  // namespace dcf::cuda_test
