// LaunchGemv (the skinny GEMM for m <= 16) against the plain path it replaces, Gemm::Linear
// (OpenBLAS on the emulator, cuBLASLt on a GPU), and a double-precision host reference on
// the same rounded inputs; its SwiGLU epilogue against Gemm::Linear + LaunchActivation; its
// RMSNorm prologue against LaunchNorm + LaunchGemv, with and without a gather of x's rows.
// Also: a row's result does not depend on the batch it is in (bit for bit), the unaligned
// fallback, and the arguments it refuses.
#include "engine/cuda/gemv.h"

#include <cstring>

#include "engine/cuda/activation.h"
#include "engine/cuda/norm.h"
#include "gtest/gtest.h"
#include "tests/unit/cuda/kernel_test_util.h"

namespace dcf::cuda_test {
namespace {

using cuda::ElemType;

struct Shape {
  int m, n, k;
  int64_t ldx, ldy;
  bool bias, accumulate;
};

cuda::GemmArgs Args(const Shape& s, const void* x, const void* w, ElemType type, const float* bias,
                    float* y) {
  cuda::GemmArgs a;
  a.m = s.m;
  a.n = s.n;
  a.k = s.k;
  a.x = x;
  a.ldx = s.ldx;
  a.w = w;
  a.dtype = type;
  a.bias = s.bias ? bias : nullptr;
  a.y = y;
  a.ldy = s.ldy;
  a.accumulate = s.accumulate;
  return a;
}

class GemvTest : public ::testing::TestWithParam<ElemType> {};

TEST_P(GemvTest, MatchesGemmLinearAndTheReference) {
  const ElemType type = GetParam();
  auto gemm = cuda::Gemm::Create(size_t{4} << 20);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  for (const Shape s : {Shape{1, 96, 64, 64, 96, false, false},      // 1 feature per block
                        Shape{1, 2600, 512, 512, 2600, true, true},   // 8 per block, residual add
                        Shape{3, 700, 264, 264, 704, true, false},    // 2 per block, K tail
                        Shape{7, 130, 72, 80, 136, true, true},       // strided x and y
                        Shape{16, 64, 256, 256, 64, true, true},      // the largest bucket
                        Shape{5, 33, 37, 41, 40, true, false}}) {     // unaligned: scalar loads
    SCOPED_TRACE(testing::Message() << "m=" << s.m << " n=" << s.n << " k=" << s.k);
    const std::vector<float> x = RandomVector(s.m * s.ldx, 51);
    const std::vector<float> w = RandomVector(static_cast<size_t>(s.n) * s.k, 52);
    const std::vector<float> bias = RandomVector(s.n, 53);
    const std::vector<float> y0 = RandomVector(s.m * s.ldy, 54);
    const std::vector<float> want =
        LinearWant(RoundTo(x, type), RoundTo(w, type), s.bias ? bias.data() : nullptr, y0, s.m, s.n,
                   s.k, s.ldx, s.ldy, s.accumulate);
    TypedBuffer dx(x, type), dw(w, type);
    DeviceBuffer<float> db(bias), dy_gemv(y0), dy_gemm(y0);
    const cuda::GemmArgs a = Args(s, dx.get(), dw.get(), type, db.get(), dy_gemv.get());
    ASSERT_TRUE(cuda::GemvHandles(a));
    ASSERT_TRUE(CudaOk(cuda::LaunchGemv(a, nullptr)));
    ASSERT_TRUE((*gemm)->Linear(Args(s, dx.get(), dw.get(), type, db.get(), dy_gemm.get()), nullptr)
                    .ok());
    ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
    const std::vector<float> got = dy_gemv.ToHost(), plain = dy_gemm.ToHost();
    EXPECT_LT(Nmse(got, want), 1e-10);
    EXPECT_LT(MaxAbs(got, want), 1e-4);
    EXPECT_LT(MaxAbs(got, plain), 1e-4);
    EXPECT_GT(MaxAbs(got, y0), 0.1);  // it wrote y
  }
}

TEST_P(GemvTest, ARowsResultDoesNotDependOnItsBatch) {
  const ElemType type = GetParam();
  const Shape s{13, 300, 512, 520, 300, true, false};
  const std::vector<float> x = RandomVector(s.m * s.ldx, 55);
  const std::vector<float> w = RandomVector(static_cast<size_t>(s.n) * s.k, 56);
  const std::vector<float> bias = RandomVector(s.n, 57);
  TypedBuffer dx(x, type), dw(w, type);
  DeviceBuffer<float> db(bias), batch(static_cast<size_t>(s.m) * s.ldy);
  ASSERT_TRUE(CudaOk(cuda::LaunchGemv(Args(s, dx.get(), dw.get(), type, db.get(), batch.get()),
                                      nullptr)));
  ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
  const std::vector<float> all = batch.ToHost();
  for (int r : {0, 6, 12}) {
    Shape one = s;
    one.m = 1;
    DeviceBuffer<float> y(static_cast<size_t>(s.ldy));
    const char* row = static_cast<const char*>(dx.get()) + r * s.ldx * cuda::ElemBytes(type);
    ASSERT_TRUE(
        CudaOk(cuda::LaunchGemv(Args(one, row, dw.get(), type, db.get(), y.get()), nullptr)));
    ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
    const std::vector<float> alone = y.ToHost();
    EXPECT_EQ(0, std::memcmp(alone.data(), all.data() + r * s.ldy, s.n * sizeof(float)))
        << "row " << r;
  }
}

TEST_P(GemvTest, SwiGluEpilogueMatchesGemmThenActivation) {
  const ElemType type = GetParam();
  auto gemm = cuda::Gemm::Create(size_t{4} << 20);
  ASSERT_TRUE(gemm.ok());
  for (const int m : {1, 4, 16}) {
    const int F = 520, k = 256;
    const Shape s{m, 2 * F, k, k, 2 * F, true, false};
    const std::vector<float> x = RandomVector(m * k, 58);
    const std::vector<float> w = RandomVector(static_cast<size_t>(2 * F) * k, 59);
    const std::vector<float> bias = RandomVector(2 * F, 60);
    TypedBuffer dx(x, type), dw(w, type), act_gemv(static_cast<size_t>(m) * F, type),
        act_plain(static_cast<size_t>(m) * F, type);
    DeviceBuffer<float> db(bias), up(static_cast<size_t>(m) * 2 * F), unused(1);
    cuda::GemvOut out;
    out.epilogue = cuda::GemvEpilogue::kSwiGlu;
    out.act = act_gemv.get();
    out.act_type = type;
    out.act_ld = F;
    ASSERT_TRUE(CudaOk(
        cuda::LaunchGemv(Args(s, dx.get(), dw.get(), type, db.get(), unused.get()), out, nullptr)));
    // The plain path: the GEMM into f32, then the activation kernel.
    ASSERT_TRUE((*gemm)->Linear(Args(s, dx.get(), dw.get(), type, db.get(), up.get()), nullptr).ok());
    cuda::ActivationParams ap;
    ap.kind = cuda::Activation::kSwiGlu;
    ap.rows = m;
    ap.width = F;
    ap.in = up.get();
    ap.out = act_plain.get();
    ap.out_type = type;
    ASSERT_TRUE(CudaOk(cuda::LaunchActivation(ap, nullptr)));
    ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
    const std::vector<float> got = act_gemv.ToHost(), plain = act_plain.ToHost();
    // f32: the sums' order differs (1e-5); 16-bit: one rounding step of the output apart.
    const double tol = type == ElemType::kF32 ? 1e-4 : 0.02;
    EXPECT_LT(MaxAbs(got, plain), tol) << "m=" << m;
    EXPECT_LT(Nmse(got, plain), type == ElemType::kF32 ? 1e-10 : 1e-4) << "m=" << m;
    EXPECT_GT(MaxAbs(got, std::vector<float>(got.size(), 0.0f)), 0.1);
  }
}

// The RMSNorm prologue (GemvIn::norm_weight) against the path it replaces, LaunchNorm into
// the compute dtype then LaunchGemv, bit for bit: both epilogues, several batch sizes,
// aligned (vector loads) and unaligned K (scalar loads), a strided residual stream.
TEST_P(GemvTest, NormPrologueEqualsNormThenGemv) {
  const ElemType type = GetParam();
  for (const Shape s : {Shape{1, 2 * 520, 2560, 2560, 2 * 520, true, false},
                        Shape{3, 700, 264, 272, 704, true, false},
                        Shape{16, 96, 512, 512, 96, false, false},
                        Shape{5, 2 * 33, 37, 41, 2 * 33, true, false}}) {
    for (const bool swiglu : {false, true}) {
      SCOPED_TRACE(testing::Message() << "m=" << s.m << " n=" << s.n << " k=" << s.k
                                      << (swiglu ? " SwiGLU" : ""));
      std::vector<float> x = RandomVector(s.m * s.ldx, 61);
      for (size_t i = 0; i < x.size(); ++i) x[i] *= 1.0f + (i % 7);  // rows of unequal rms
      const std::vector<float> w = RandomVector(static_cast<size_t>(s.n) * s.k, 62);
      const std::vector<float> bias = RandomVector(s.n, 63);
      std::vector<float> norm_w = RandomVector(s.k, 64);
      for (float& v : norm_w) v += 1.0f;
      TypedBuffer dw(w, type), normed(static_cast<size_t>(s.m) * s.k, type);
      const int F = s.n / 2;
      TypedBuffer act_fused(static_cast<size_t>(s.m) * F, type),
          act_plain(static_cast<size_t>(s.m) * F, type);
      DeviceBuffer<float> dx(x), db(bias), dn(norm_w), y_fused(static_cast<size_t>(s.m) * s.ldy),
          y_plain(static_cast<size_t>(s.m) * s.ldy);
      cuda::GemvOut out_fused, out_plain;
      if (swiglu) {
        out_fused.epilogue = out_plain.epilogue = cuda::GemvEpilogue::kSwiGlu;
        out_fused.act = act_fused.get();
        out_plain.act = act_plain.get();
        out_fused.act_type = out_plain.act_type = type;
        out_fused.act_ld = out_plain.act_ld = F;
      }
      // The plain path: the norm kernel into the compute dtype, then the GEMV.
      cuda::NormParams np;
      np.rows = s.m;
      np.dim = s.k;
      np.x = dx.get();
      np.eps = 1e-5;
      np.weight = dn.get();
      np.out = normed.get();
      np.out_type = type;
      if (s.ldx == s.k) {
        ASSERT_TRUE(CudaOk(cuda::LaunchNorm(np, nullptr)));
      } else {  // the norm kernel reads rows dim apart: one launch per row
        for (int r = 0; r < s.m; ++r) {
          cuda::NormParams one = np;
          one.rows = 1;
          one.x = dx.get() + r * s.ldx;
          one.out = static_cast<char*>(normed.get()) + r * s.k * cuda::ElemBytes(type);
          ASSERT_TRUE(CudaOk(cuda::LaunchNorm(one, nullptr)));
        }
      }
      Shape plain = s;
      plain.ldx = s.k;
      ASSERT_TRUE(CudaOk(cuda::LaunchGemv(
          Args(plain, normed.get(), dw.get(), type, db.get(), y_plain.get()), out_plain, nullptr)));
      cuda::GemvIn in;
      in.norm_weight = dn.get();
      in.eps = 1e-5;
      ASSERT_TRUE(CudaOk(cuda::LaunchGemv(Args(s, dx.get(), dw.get(), type, db.get(), y_fused.get()),
                                          out_fused, in, nullptr)));
      ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
      const std::vector<float> got = swiglu ? act_fused.ToHost() : y_fused.ToHost();
      const std::vector<float> want = swiglu ? act_plain.ToHost() : y_plain.ToHost();
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
      EXPECT_GT(MaxAbs(got, std::vector<float>(got.size(), 0.0f)), 0.1);
    }
  }
}

// dcpythia's LayerNorm prologue (GemvIn::layer_norm, with and without a bias) and the GELU
// epilogue against the path they replace, bit for bit: LaunchNorm (LayerNorm) into the
// compute dtype, LaunchGemv into f32, then LaunchActivation's kGelu.
TEST_P(GemvTest, LayerNormPrologueAndGeluEqualNormThenGemvThenActivation) {
  const ElemType type = GetParam();
  for (const Shape s : {Shape{1, 40, 2560, 2560, 40, true, false},
                        Shape{3, 700, 264, 272, 704, true, false},
                        Shape{16, 96, 512, 512, 96, false, false},
                        Shape{5, 33, 37, 41, 33, true, false}}) {
    for (const bool gelu : {false, true}) {
      for (const bool norm_bias : {false, true}) {
        SCOPED_TRACE(testing::Message() << "m=" << s.m << " n=" << s.n << " k=" << s.k
                                        << (gelu ? " GELU" : "") << (norm_bias ? " bias" : ""));
        std::vector<float> x = RandomVector(s.m * s.ldx, 71);
        for (size_t i = 0; i < x.size(); ++i) x[i] = x[i] * (1.0f + i % 5) + 0.3f * (i % 3);
        const std::vector<float> w = RandomVector(static_cast<size_t>(s.n) * s.k, 72);
        const std::vector<float> bias = RandomVector(s.n, 73);
        std::vector<float> norm_w = RandomVector(s.k, 74);
        for (float& v : norm_w) v += 1.0f;
        const std::vector<float> norm_b = RandomVector(s.k, 75);
        TypedBuffer dw(w, type), normed(static_cast<size_t>(s.m) * s.k, type),
            act_fused(static_cast<size_t>(s.m) * s.n, type),
            act_plain(static_cast<size_t>(s.m) * s.n, type);
        DeviceBuffer<float> dx(x), db(bias), dn(norm_w), dnb(norm_b),
            y_fused(static_cast<size_t>(s.m) * s.ldy), y_plain(static_cast<size_t>(s.m) * s.ldy);
        cuda::NormParams np;
        np.rows = 1;
        np.dim = s.k;
        np.layer_norm = true;
        np.eps = 1e-5;
        np.weight = dn.get();
        np.bias = norm_bias ? dnb.get() : nullptr;
        np.out_type = type;
        for (int r = 0; r < s.m; ++r) {  // the norm kernel reads rows dim apart
          np.x = dx.get() + r * s.ldx;
          np.out = static_cast<char*>(normed.get()) + r * s.k * cuda::ElemBytes(type);
          ASSERT_TRUE(CudaOk(cuda::LaunchNorm(np, nullptr)));
        }
        Shape plain = s;
        plain.ldx = s.k;
        if (gelu) plain.ldy = s.n;  // the activation kernel reads rows n apart
        ASSERT_TRUE(CudaOk(cuda::LaunchGemv(
            Args(plain, normed.get(), dw.get(), type, db.get(), y_plain.get()), nullptr)));
        if (gelu) {
          cuda::ActivationParams ap;
          ap.kind = cuda::Activation::kGelu;
          ap.rows = s.m;
          ap.width = s.n;
          ap.in = y_plain.get();
          ap.out = act_plain.get();
          ap.out_type = type;
          ASSERT_TRUE(CudaOk(cuda::LaunchActivation(ap, nullptr)));
        }
        cuda::GemvIn in;
        in.norm_weight = dn.get();
        in.layer_norm = true;
        in.norm_bias = norm_bias ? dnb.get() : nullptr;
        in.eps = 1e-5;
        cuda::GemvOut out;
        if (gelu) {
          out.epilogue = cuda::GemvEpilogue::kGelu;
          out.act = act_fused.get();
          out.act_type = type;
          out.act_ld = s.n;
        }
        ASSERT_TRUE(CudaOk(cuda::LaunchGemv(
            Args(s, dx.get(), dw.get(), type, db.get(), y_fused.get()), out, in, nullptr)));
        ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
        const std::vector<float> got = gelu ? act_fused.ToHost() : y_fused.ToHost();
        const std::vector<float> want = gelu ? act_plain.ToHost() : y_plain.ToHost();
        ASSERT_EQ(got.size(), want.size());
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
        EXPECT_GT(MaxAbs(got, std::vector<float>(got.size(), 0.0f)), 0.1);
      }
    }
  }
}

// The final norm folded into the logits GEMV (GemvIn::row_index): the rows that need logits
// gathered from the residual stream, against LaunchNorm's own gather (NormParams::row_index)
// into the compute dtype then LaunchGemv, bit for bit: RMSNorm and LayerNorm (with a bias),
// one row, a row taken twice (3 rows of the 4-row kernel), a whole batch out of order,
// aligned and unaligned K.
TEST_P(GemvTest, GatheredNormPrologueEqualsGatheringNormThenGemv) {
  const ElemType type = GetParam();
  constexpr int kTokens = 20;  // rows of the residual stream
  for (const int k : {256, 37}) {
    for (const std::vector<int32_t>& rows :
         {std::vector<int32_t>{13}, std::vector<int32_t>{19, 2, 2},
          std::vector<int32_t>{15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0}}) {
      for (const bool layer_norm : {false, true}) {
        const int m = static_cast<int>(rows.size()), n = 40;  // 40 blocks: cheap to emulate
        SCOPED_TRACE(testing::Message() << "k=" << k << " m=" << m
                                        << (layer_norm ? " LayerNorm" : " RMSNorm"));
        std::vector<float> x = RandomVector(static_cast<size_t>(kTokens) * k, 81);
        for (size_t i = 0; i < x.size(); ++i) x[i] = x[i] * (1.0f + i % 7) + 0.2f * (i % 3);
        const std::vector<float> w = RandomVector(static_cast<size_t>(n) * k, 82);
        std::vector<float> norm_w = RandomVector(k, 83);
        for (float& v : norm_w) v += 1.0f;
        const std::vector<float> norm_b = RandomVector(k, 84);
        TypedBuffer dw(w, type), normed(static_cast<size_t>(m) * k, type);
        DeviceBuffer<float> dx(x), dn(norm_w), dnb(norm_b), y_fused(static_cast<size_t>(m) * n),
            y_plain(static_cast<size_t>(m) * n);
        DeviceBuffer<int32_t> drows(rows);
        cuda::NormParams np;
        np.rows = m;
        np.dim = k;
        np.x = dx.get();
        np.row_index = drows.get();
        np.layer_norm = layer_norm;
        np.eps = 1e-5;
        np.weight = dn.get();
        np.bias = layer_norm ? dnb.get() : nullptr;
        np.out = normed.get();
        np.out_type = type;
        ASSERT_TRUE(CudaOk(cuda::LaunchNorm(np, nullptr)));
        const Shape s{m, n, k, k, n, false, false};
        ASSERT_TRUE(CudaOk(cuda::LaunchGemv(
            Args(s, normed.get(), dw.get(), type, nullptr, y_plain.get()), nullptr)));
        cuda::GemvIn in;
        in.norm_weight = dn.get();
        in.layer_norm = layer_norm;
        in.norm_bias = layer_norm ? dnb.get() : nullptr;
        in.eps = 1e-5;
        in.row_index = drows.get();
        const cuda::GemmArgs fused = Args(s, dx.get(), dw.get(), type, nullptr, y_fused.get());
        ASSERT_TRUE(CudaOk(cuda::LaunchGemv(fused, cuda::GemvOut{}, in, nullptr)));
        ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
        const std::vector<float> got = y_fused.ToHost(), want = y_plain.ToHost();
        EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
        EXPECT_GT(MaxAbs(got, std::vector<float>(got.size(), 0.0f)), 0.1);
        if (m == 3) {  // the row taken twice: the same bits twice
          EXPECT_EQ(0, std::memcmp(got.data() + n, got.data() + 2 * n, n * sizeof(float)));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, GemvTest,
                         ::testing::Values(ElemType::kF32, ElemType::kBF16, ElemType::kF16),
                         [](const auto& info) { return std::string(TypeName(info.param)); });

TEST(Gemv, GridFillsTwoWavesWhenTheFeaturesAllow) {
  EXPECT_EQ(cuda::GemvGridFor(2560).features_per_block, 8);  // Wo and W2 of DCFormer-2.8B
  EXPECT_EQ(cuda::GemvGridFor(2560).blocks, 320);
  EXPECT_EQ(cuda::GemvGridFor(1000).features_per_block, 2);
  EXPECT_EQ(cuda::GemvGridFor(1000).blocks, 500);
  EXPECT_EQ(cuda::GemvGridFor(64).features_per_block, 1);
  EXPECT_EQ(cuda::GemvGridFor(64).blocks, 64);
}

TEST(Gemv, RefusesWhatItDoesNotHandle) {
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
  EXPECT_TRUE(cuda::GemvHandles(a));
  cuda::GemmArgs big = a;
  big.m = cuda::kGemvMaxRows + 1;
  EXPECT_FALSE(cuda::GemvHandles(big));
  EXPECT_EQ(cuda::LaunchGemv(big, nullptr), cudaErrorInvalidValue);
  cuda::GemmArgs none = a;
  none.m = 0;
  EXPECT_FALSE(cuda::GemvHandles(none));
  cuda::GemmArgs bad = a;
  bad.ldx = 4;
  EXPECT_EQ(cuda::LaunchGemv(bad, nullptr), cudaErrorInvalidValue);
  cuda::GemvOut glu;
  glu.epilogue = cuda::GemvEpilogue::kSwiGlu;
  EXPECT_EQ(cuda::LaunchGemv(a, glu, nullptr), cudaErrorInvalidValue);  // no act buffer
  glu.act = buf.get();
  glu.act_ld = 2;
  a.n = 3;
  EXPECT_EQ(cuda::LaunchGemv(a, glu, nullptr), cudaErrorInvalidValue);  // odd n
  a.n = 4;
  cuda::GemvIn layer_norm;
  layer_norm.norm_weight = buf.get();
  layer_norm.layer_norm = true;
  EXPECT_EQ(cuda::LaunchGemv(a, glu, layer_norm, nullptr), cudaErrorInvalidValue);
  cuda::GemvOut gelu;
  gelu.epilogue = cuda::GemvEpilogue::kGelu;
  EXPECT_EQ(cuda::LaunchGemv(a, gelu, nullptr), cudaErrorInvalidValue);  // no act buffer
  DeviceBuffer<float> act(16);
  gelu.act = act.get();
  gelu.act_ld = 3;
  EXPECT_EQ(cuda::LaunchGemv(a, gelu, nullptr), cudaErrorInvalidValue);  // act_ld < n
  gelu.act_ld = 4;
  cuda::GemmArgs acc = a;
  acc.accumulate = true;
  EXPECT_EQ(cuda::LaunchGemv(acc, gelu, nullptr), cudaErrorInvalidValue);  // nothing to add to
  EXPECT_EQ(cuda::LaunchGemv(a, gelu, nullptr), cudaSuccess);
  EXPECT_TRUE(CudaOk(cudaDeviceSynchronize()));
}

}  // namespace
}  // namespace dcf::cuda_test
