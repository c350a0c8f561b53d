// RMSNorm / LayerNorm kernel against the CPU ops (cpu::RmsNorm, cpu::LayerNorm).
#include "engine/cuda/norm.h"

#include "engine/cpu/cpu_ops.h"
#include "gtest/gtest.h"
#include "tests/unit/cuda/kernel_test_util.h"

namespace dcf::cuda_test {
namespace {

using cuda::ElemType;

struct Tol {
  double nmse, max_abs;
};
Tol TolFor(ElemType t) { return t == ElemType::kF32 ? Tol{1e-12, 1e-5} : Tol{1e-4, 0.05}; }

class NormTest : public ::testing::TestWithParam<ElemType> {};

TEST_P(NormTest, RmsNormMatchesCpuWithRowGather) {
  const ElemType type = GetParam();
  const int E = 1000, rows_in = 9;
  const std::vector<float> x = RandomVector(rows_in * E, 1, -3, 3);
  const std::vector<float> w = RandomVector(E, 2, 0.5, 1.5);
  const std::vector<int32_t> index = {8, 0, 3, 3};
  std::vector<float> gathered;
  for (int r : index) gathered.insert(gathered.end(), x.begin() + r * E, x.begin() + (r + 1) * E);
  std::vector<float> want(index.size() * E);
  cpu::RmsNorm(gathered.data(), w.data(), index.size(), E, 1e-6, want.data());

  DeviceBuffer<float> dx(x), dw(w);
  DeviceBuffer<int32_t> di(index);
  TypedBuffer out(index.size() * E, type);
  cuda::NormParams p;
  p.rows = index.size();
  p.dim = E;
  p.x = dx.get();
  p.row_index = di.get();
  p.eps = 1e-6;
  p.weight = dw.get();
  p.out = out.get();
  p.out_type = type;
  ASSERT_TRUE(CudaOk(cuda::LaunchNorm(p, nullptr)));
  ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
  const std::vector<float> got = out.ToHost();
  EXPECT_LT(Nmse(got, want), TolFor(type).nmse);
  EXPECT_LT(MaxAbs(got, want), TolFor(type).max_abs);
}

TEST_P(NormTest, LayerNormWithBiasAndSecondOutputMatchesCpu) {
  const ElemType type = GetParam();
  const int E = 768, R = 5;
  const std::vector<float> x = RandomVector(R * E, 3, -2, 4);  // nonzero mean
  const std::vector<float> w1 = RandomVector(E, 4, 0.5, 1.5), b1 = RandomVector(E, 5);
  const std::vector<float> w2 = RandomVector(E, 6, 0.5, 1.5), b2 = RandomVector(E, 7);
  std::vector<float> want1(R * E), want2(R * E);
  cpu::LayerNorm(x.data(), w1.data(), b1.data(), R, E, 1e-5, want1.data());
  cpu::LayerNorm(x.data(), w2.data(), b2.data(), R, E, 1e-5, want2.data());

  DeviceBuffer<float> dx(x), dw1(w1), db1(b1), dw2(w2), db2(b2);
  TypedBuffer out1(R * E, type), out2(R * E, type);
  cuda::NormParams p;
  p.rows = R;
  p.dim = E;
  p.x = dx.get();
  p.layer_norm = true;
  p.eps = 1e-5;
  p.weight = dw1.get();
  p.bias = db1.get();
  p.out = out1.get();
  p.weight2 = dw2.get();
  p.bias2 = db2.get();
  p.out2 = out2.get();
  p.out_type = type;
  ASSERT_TRUE(CudaOk(cuda::LaunchNorm(p, nullptr)));
  ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
  for (const auto& [buf, want] : {std::pair{&out1, &want1}, std::pair{&out2, &want2}}) {
    const std::vector<float> got = buf->ToHost();
    EXPECT_LT(Nmse(got, *want), TolFor(type).nmse);
    EXPECT_LT(MaxAbs(got, *want), TolFor(type).max_abs);
  }
}

INSTANTIATE_TEST_SUITE_P(Types, NormTest,
                         ::testing::Values(ElemType::kF32, ElemType::kBF16, ElemType::kF16),
                         [](const auto& info) { return std::string(TypeName(info.param)); });

}  // namespace
}  // namespace dcf::cuda_test
