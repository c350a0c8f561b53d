// LaunchGemv with int8 and fp8 E4M3 weights and per-channel scales (gemv.h, gemm.h):
// - bit for bit the f32 GEMV of the same rows on the codes' exact values, then the epilogue
//   rule (v = S * scale[n] rounded on its own, + bias, + y): the same block layout and order
//   of sums, the decode exact; and within f32 rounding of a double reference;
// - a row's result does not depend on the batch it is in (bit for bit);
// - the RMSNorm prologue equals LaunchNorm then the GEMV, bit for bit, and the SwiGLU and
//   GELU epilogues equal the linear GEMV then LaunchActivation;
// for every compute dtype of x; and rows that are not 16-byte aligned are refused (the
// library path takes them: gemm_quant_test).
#include <cstring>

#include "engine/cuda/activation.h"
#include "engine/cuda/gemv.h"
#include "engine/cuda/norm.h"
#include "gtest/gtest.h"
#include "tests/unit/cuda/quant_test_util.h"

namespace dcf::cuda_test {
namespace {

using cuda::ElemType;
using cuda::WeightType;

struct Shape {
  int m, n, k;
  int64_t ldx, ldy;
  bool bias, accumulate;
};

cuda::GemmArgs Args(const Shape& s, const void* x, ElemType type, const void* w, WeightType wt,
                    const float* scale, const float* bias, float* y) {
  cuda::GemmArgs a;
  a.m = s.m;
  a.n = s.n;
  a.k = s.k;
  a.x = x;
  a.ldx = s.ldx;
  a.w = w;
  a.dtype = type;
  a.wtype = wt;
  a.w_scale = scale;
  a.bias = s.bias ? bias : nullptr;
  a.y = y;
  a.ldy = s.ldy;
  a.accumulate = s.accumulate;
  return a;
}

using Param = std::tuple<WeightType, ElemType>;

class GemvQuantTest : public ::testing::TestWithParam<Param> {
 protected:
  WeightType wtype() const { return std::get<0>(GetParam()); }
  ElemType type() const { return std::get<1>(GetParam()); }
};

TEST_P(GemvQuantTest, IsTheF32GemvOfTheCodesThenTheScaleEpilogue) {
  for (const Shape s : {Shape{1, 2600, 512, 512, 2600, true, true},  // 8 features per block
                        Shape{3, 700, 264, 264, 704, true, false},   // 2 per block, K tail
                        Shape{16, 64, 256, 256, 64, false, true}}) {  // the largest bucket
    SCOPED_TRACE(testing::Message() << "m=" << s.m << " n=" << s.n << " k=" << s.k);
    const std::vector<float> x = RoundTo(RandomVector(s.m * s.ldx, 91), type());
    const HostQuantMatrix w =
        QuantizeMatrix(RandomVector(static_cast<size_t>(s.n) * s.k, 92), s.n, s.k, wtype());
    const std::vector<float> bias = RandomVector(s.n, 93);
    const std::vector<float> y0 = RandomVector(s.m * s.ldy, 94);
    TypedBuffer dx(x, type()), dx32(x, ElemType::kF32), dvalues(w.values, ElemType::kF32);
    DeviceQuantMatrix dw(w);
    DeviceBuffer<float> db(bias), dy(y0), dsums(static_cast<size_t>(s.m) * s.ldy);
    ASSERT_TRUE(CudaOk(cuda::LaunchGemv(Args(s, dx.get(), type(), dw.codes.get(), wtype(),
                                             dw.scale.get(), db.get(), dy.get()),
                                        nullptr)));
    // The same sums from the f32 GEMV of the codes' values (no bias, no accumulation).
    Shape plain = s;
    plain.bias = plain.accumulate = false;
    ASSERT_TRUE(CudaOk(cuda::LaunchGemv(Args(plain, dx32.get(), ElemType::kF32, dvalues.get(),
                                             WeightType::kDense, nullptr, nullptr, dsums.get()),
                                        nullptr)));
    ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
    const std::vector<float> got = dy.ToHost(), sums = dsums.ToHost();
    std::vector<float> want = y0;
    for (int r = 0; r < s.m; ++r) {
      for (int c = 0; c < s.n; ++c) {
        float v = MulRounded(sums[r * s.ldy + c], w.scale[c]);
        if (s.bias) v += bias[c];
        float& y = want[r * s.ldy + c];
        y = s.accumulate ? y + v : v;
      }
    }
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
    const std::vector<float> ref =
        QuantLinearWant(x, w, s.bias ? bias.data() : nullptr, y0, s.m, s.ldx, s.ldy, s.accumulate);
    EXPECT_LT(Nmse(got, ref), 1e-10);
    EXPECT_LT(MaxAbs(got, ref), 1e-4);
    EXPECT_GT(MaxAbs(got, y0), 0.1);  // it wrote y
  }
}

TEST_P(GemvQuantTest, ARowsResultDoesNotDependOnItsBatch) {
  const Shape s{13, 300, 512, 520, 300, true, false};
  const std::vector<float> x = RandomVector(s.m * s.ldx, 95);
  const HostQuantMatrix w =
      QuantizeMatrix(RandomVector(static_cast<size_t>(s.n) * s.k, 96), s.n, s.k, wtype());
  const std::vector<float> bias = RandomVector(s.n, 97);
  TypedBuffer dx(x, type());
  DeviceQuantMatrix dw(w);
  DeviceBuffer<float> db(bias), batch(static_cast<size_t>(s.m) * s.ldy);
  ASSERT_TRUE(CudaOk(cuda::LaunchGemv(
      Args(s, dx.get(), type(), dw.codes.get(), wtype(), dw.scale.get(), db.get(), batch.get()),
      nullptr)));
  ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
  const std::vector<float> all = batch.ToHost();
  for (int r : {0, 6, 12}) {
    Shape one = s;
    one.m = 1;
    DeviceBuffer<float> y(static_cast<size_t>(s.ldy));
    const char* row = static_cast<const char*>(dx.get()) + r * s.ldx * cuda::ElemBytes(type());
    ASSERT_TRUE(CudaOk(cuda::LaunchGemv(
        Args(one, row, type(), dw.codes.get(), wtype(), dw.scale.get(), db.get(), y.get()),
        nullptr)));
    ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
    const std::vector<float> alone = y.ToHost();
    EXPECT_EQ(0, std::memcmp(alone.data(), all.data() + r * s.ldy, s.n * sizeof(float)))
        << "row " << r;
  }
}

// The prologues and epilogues of the decode layer with quantized weights, against the paths
// they replace: LaunchNorm then the GEMV; the linear GEMV then LaunchActivation.
TEST_P(GemvQuantTest, ProloguesAndEpiloguesEqualThePlainPath) {
  for (const bool layer_norm : {false, true}) {
    for (const int k : {264, 128}) {
      const int m = 3, F = 40;  // n = 2F for SwiGLU, F for GELU
      const int n = layer_norm ? F : 2 * F;
      SCOPED_TRACE(testing::Message() << (layer_norm ? "LayerNorm + GELU" : "RMSNorm + SwiGLU")
                                      << " k=" << k);
      std::vector<float> x = RandomVector(static_cast<size_t>(m) * k, 98);
      for (size_t i = 0; i < x.size(); ++i) x[i] *= 1.0f + (i % 7);
      const HostQuantMatrix w =
          QuantizeMatrix(RandomVector(static_cast<size_t>(n) * k, 99), n, k, wtype());
      const std::vector<float> bias = RandomVector(n, 100);
      std::vector<float> norm_w = RandomVector(k, 101);
      for (float& v : norm_w) v += 1.0f;
      const std::vector<float> norm_b = RandomVector(k, 102);
      DeviceQuantMatrix dw(w);
      DeviceBuffer<float> dx(x), db(bias), dn(norm_w), dnb(norm_b),
          y_norm(static_cast<size_t>(m) * n), y_plain(static_cast<size_t>(m) * n);
      TypedBuffer normed(static_cast<size_t>(m) * k, type()),
          act_fused(static_cast<size_t>(m) * F, type()),
          act_plain(static_cast<size_t>(m) * F, type());
      const Shape s{m, n, k, k, n, true, false};
      // Plain: the norm kernel, the linear GEMV, the activation kernel.
      cuda::NormParams np;
      np.rows = m;
      np.dim = k;
      np.x = dx.get();
      np.layer_norm = layer_norm;
      np.eps = 1e-5;
      np.weight = dn.get();
      np.bias = layer_norm ? dnb.get() : nullptr;
      np.out = normed.get();
      np.out_type = type();
      ASSERT_TRUE(CudaOk(cuda::LaunchNorm(np, nullptr)));
      ASSERT_TRUE(CudaOk(cuda::LaunchGemv(Args(s, normed.get(), type(), dw.codes.get(), wtype(),
                                               dw.scale.get(), db.get(), y_plain.get()),
                                          nullptr)));
      cuda::ActivationParams ap;
      ap.kind = layer_norm ? cuda::Activation::kGelu : cuda::Activation::kSwiGlu;
      ap.rows = m;
      ap.width = F;
      ap.in = y_plain.get();
      ap.out = act_plain.get();
      ap.out_type = type();
      ASSERT_TRUE(CudaOk(cuda::LaunchActivation(ap, nullptr)));
      // Fused: the norm in the prologue (linear epilogue), then with the activation too.
      cuda::GemvIn in;
      in.norm_weight = dn.get();
      in.layer_norm = layer_norm;
      in.norm_bias = layer_norm ? dnb.get() : nullptr;
      in.eps = 1e-5;
      const cuda::GemmArgs fused = Args(s, dx.get(), type(), dw.codes.get(), wtype(),
                                        dw.scale.get(), db.get(), y_norm.get());
      ASSERT_TRUE(CudaOk(cuda::LaunchGemv(fused, cuda::GemvOut{}, in, nullptr)));
      cuda::GemvOut out;
      out.epilogue = layer_norm ? cuda::GemvEpilogue::kGelu : cuda::GemvEpilogue::kSwiGlu;
      out.act = act_fused.get();
      out.act_type = type();
      out.act_ld = F;
      ASSERT_TRUE(CudaOk(cuda::LaunchGemv(fused, out, in, nullptr)));
      ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
      const std::vector<float> a = y_norm.ToHost(), b = y_plain.ToHost();
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
      const std::vector<float> fa = act_fused.ToHost(), pa = act_plain.ToHost();
      EXPECT_EQ(0, std::memcmp(fa.data(), pa.data(), fa.size() * sizeof(float)));
      EXPECT_GT(MaxAbs(fa, std::vector<float>(fa.size(), 0.0f)), 0.01);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Types, GemvQuantTest,
    ::testing::Combine(::testing::Values(WeightType::kI8, WeightType::kFp8),
                       ::testing::Values(ElemType::kF32, ElemType::kBF16, ElemType::kF16)),
    [](const auto& info) {
      return std::string(WeightName(std::get<0>(info.param))) + "_" +
             TypeName(std::get<1>(info.param));
    });

TEST(GemvQuant, RefusesQuantizedWeightsWithoutScales) {
  DeviceBuffer<float> buf(64);
  cuda::GemmArgs a;
  a.m = 2;
  a.n = 4;
  a.k = 8;
  a.x = buf.get();
  a.ldx = 8;
  a.w = buf.get();
  a.y = buf.get();
  a.ldy = 4;
  a.wtype = WeightType::kI8;
  EXPECT_FALSE(cuda::GemvHandles(a));
  EXPECT_EQ(cuda::LaunchGemv(a, nullptr), cudaErrorInvalidValue);
  a.w_scale = buf.get();
  EXPECT_TRUE(cuda::GemvHandles(a));
  a.fp8_activations = true;  // only with fp8 weights
  EXPECT_FALSE(cuda::GemvHandles(a));
  a.fp8_activations = false;
  // Rows that are not 16-byte aligned (no scalar form of the codes' loads).
  cuda::GemmArgs odd = a;
  odd.k = odd.ldx = 6;
  EXPECT_FALSE(cuda::GemvHandles(odd));
  EXPECT_EQ(cuda::LaunchGemv(odd, nullptr), cudaErrorInvalidValue);
  cuda::GemmArgs shifted = a;
  shifted.w = buf.get() + 2;
  EXPECT_FALSE(cuda::GemvHandles(shifted));
  cuda::GemmArgs dense = odd;  // weights in the compute dtype keep their scalar path
  dense.wtype = WeightType::kDense;
  dense.w_scale = nullptr;
  EXPECT_TRUE(cuda::GemvHandles(dense));
}

}  // namespace
}  // namespace dcf::cuda_test
