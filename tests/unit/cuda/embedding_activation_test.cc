// Embedding gather and the MLP activations against host references (cpu::Silu,
// cpu::GeluErf).
#include "engine/cpu/cpu_ops.h"
#include "engine/cuda/activation.h"
#include "engine/cuda/embedding.h"
#include "gtest/gtest.h"
#include "tests/unit/cuda/kernel_test_util.h"

namespace dcf::cuda_test {
namespace {

using cuda::ElemType;

class ElemTypeTest : public ::testing::TestWithParam<ElemType> {};

TEST_P(ElemTypeTest, EmbeddingGathersRowsExactlyChainedOnesFromThePreviousSamples) {
  const ElemType type = GetParam();
  const int V = 50, E = 300;
  const std::vector<float> table = RandomVector(V * E, 11);
  const std::vector<float> rounded = RoundTo(table, type);
  // The last three are chained (step_batch.h): rows 2, 0 and 1 of the previous step's
  // samples, which hold 41, -1 (nothing drawn: read as 0) and an id beyond the vocabulary
  // (likewise).
  const std::vector<int32_t> tokens = {3, 49, 0, 3, 17, -4, -2, -3};
  const std::vector<int32_t> chained = {-1, V, 41};
  const std::vector<int32_t> ids = {3, 49, 0, 3, 17, 41, 0, 0};
  TypedBuffer dt(table, type);
  DeviceBuffer<int32_t> dtok(tokens);
  DeviceBuffer<int32_t> dchained(chained);
  DeviceBuffer<float> out(tokens.size() * E);
  cuda::EmbeddingParams p;
  p.num_tokens = tokens.size();
  p.dim = E;
  p.tokens = dtok.get();
  p.chained = dchained.get();
  p.vocab = V;
  p.table = dt.get();
  p.table_type = type;
  p.out = out.get();
  ASSERT_TRUE(CudaOk(cuda::LaunchEmbedding(p, nullptr)));
  const std::vector<float> got = out.ToHost();
  for (size_t t = 0; t < tokens.size(); ++t) {
    for (int e = 0; e < E; ++e) {
      ASSERT_EQ(got[t * E + e], rounded[ids[t] * E + e]) << "token " << t << " dim " << e;
    }
  }
}

TEST_P(ElemTypeTest, SwiGluAndGeluMatchCpu) {
  const ElemType type = GetParam();
  const int T = 7, F = 333;
  const std::vector<float> in = RandomVector(T * 2 * F, 12, -6, 6);
  std::vector<float> want_swiglu(T * F), want_gelu(T * F);
  for (int t = 0; t < T; ++t) {
    for (int f = 0; f < F; ++f) {
      want_swiglu[t * F + f] = cpu::Silu(in[t * 2 * F + f]) * in[t * 2 * F + F + f];
      want_gelu[t * F + f] = cpu::GeluErf(in[t * F + f]);
    }
  }
  DeviceBuffer<float> din(in);
  for (cuda::Activation kind : {cuda::Activation::kSwiGlu, cuda::Activation::kGelu}) {
    TypedBuffer out(T * F, type);
    cuda::ActivationParams p;
    p.kind = kind;
    p.rows = T;
    p.width = F;
    p.in = din.get();
    p.out = out.get();
    p.out_type = type;
    ASSERT_TRUE(CudaOk(cuda::LaunchActivation(p, nullptr)));
    const std::vector<float> got = out.ToHost();
    const std::vector<float>& want = kind == cuda::Activation::kSwiGlu ? want_swiglu : want_gelu;
    const bool f32 = type == ElemType::kF32;
    EXPECT_LT(Nmse(got, want), f32 ? 1e-12 : 1e-4);
    EXPECT_LT(MaxAbs(got, want), f32 ? 1e-5 : 0.25);  // |want| < 36: bf16 steps of 0.125
  }
}

INSTANTIATE_TEST_SUITE_P(Types, ElemTypeTest,
                         ::testing::Values(ElemType::kF32, ElemType::kBF16, ElemType::kF16),
                         [](const auto& info) { return std::string(TypeName(info.param)); });

}  // namespace
}  // namespace dcf::cuda_test
