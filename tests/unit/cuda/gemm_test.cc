// The GEMM wrapper (cuBLASLt on a GPU, OpenBLAS on the emulator) against a double-precision
// host reference on the same (rounded) inputs: bias, accumulation, strided rows, every compute
// dtype.
#include "engine/cuda/gemm.h"

#include "gtest/gtest.h"
#include "tests/unit/cuda/kernel_test_util.h"

namespace dcf::cuda_test {
namespace {

using cuda::ElemType;

class GemmTest : public ::testing::TestWithParam<ElemType> {};

TEST_P(GemmTest, LinearMatchesCpu) {
  const ElemType type = GetParam();
  auto gemm = cuda::Gemm::Create(size_t{4} << 20);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  struct Shape {
    int m, n, k;
    int64_t ldx, ldy;
    bool bias, accumulate;
  };
  for (const Shape s :
       {Shape{1, 96, 64, 64, 96, false, false}, Shape{7, 130, 72, 80, 136, true, false},
        Shape{16, 64, 256, 256, 64, true, true}, Shape{0, 8, 8, 8, 8, false, false}}) {
    const std::vector<float> x = RandomVector(std::max(1, s.m) * s.ldx, 41);
    const std::vector<float> w = RandomVector(s.n * s.k, 42);
    const std::vector<float> bias = RandomVector(s.n, 43);
    const std::vector<float> y0 = RandomVector(std::max(1, s.m) * s.ldy, 44);
    const std::vector<float> want =
        LinearWant(RoundTo(x, type), RoundTo(w, type), s.bias ? bias.data() : nullptr, y0, s.m, s.n,
                   s.k, s.ldx, s.ldy, s.accumulate);
    TypedBuffer dx(x, type), dw(w, type);
    DeviceBuffer<float> db(bias), dy(y0);
    cuda::GemmArgs a;
    a.m = s.m;
    a.n = s.n;
    a.k = s.k;
    a.x = dx.get();
    a.ldx = s.ldx;
    a.w = dw.get();
    a.dtype = type;
    a.bias = s.bias ? db.get() : nullptr;
    a.y = dy.get();
    a.ldy = s.ldy;
    a.accumulate = s.accumulate;
    ASSERT_TRUE((*gemm)->Linear(a, nullptr).ok());
    ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
    const std::vector<float> got = dy.ToHost();
    EXPECT_LT(Nmse(got, want), 1e-10) << "m=" << s.m << " n=" << s.n << " k=" << s.k;
    EXPECT_LT(MaxAbs(got, want), 1e-4) << "m=" << s.m << " n=" << s.n << " k=" << s.k;
  }
}

TEST(GemmTest, RejectsMalformedShapes) {
  auto gemm = cuda::Gemm::Create(0);
  ASSERT_TRUE(gemm.ok());
  DeviceBuffer<float> buf(64);
  cuda::GemmArgs a;
  a.m = 2;
  a.n = 4;
  a.k = 8;
  a.x = buf.get();
  a.ldx = 4;  // < k
  a.w = buf.get();
  a.y = buf.get();
  a.ldy = 4;
  EXPECT_EQ((*gemm)->Linear(a, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Types, GemmTest,
                         ::testing::Values(ElemType::kF32, ElemType::kBF16, ElemType::kF16),
                         [](const auto& info) { return std::string(TypeName(info.param)); });

}  // namespace
}  // namespace dcf::cuda_test
