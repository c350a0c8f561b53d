// The contract's device math against the host's double-precision functions (with the
// tolerances a GPU needs: its fast intrinsics are approximate) and its vector types.
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/simt/cuda_test_util.h"
#include "tests/unit/simt/test_kernels.h"

namespace dcf::cuda_test {
namespace {

TEST(MathTest, FunctionsMatchTheHost) {
  std::vector<float> in;
  for (float x = 0.05f; x < 6.0f; x += 0.37f) in.push_back(x);
  const int n = static_cast<int>(in.size());
  DeviceBuffer<float> d_in(in);
  DeviceBuffer<float> d_out(static_cast<size_t>(n) * kMathFunctions);
  ASSERT_TRUE(CudaOk(LaunchMath(d_in.get(), d_out.get(), n, nullptr)));
  const std::vector<float> out = d_out.ToHost();
  struct Reference {
    const char* name;
    double (*f)(double);
    double relative_tolerance;
  };
  const Reference refs[kMathFunctions] = {
      {"expf", [](double x) { return std::exp(x); }, 1e-6},
      {"__expf", [](double x) { return std::exp(x); }, 1e-5},
      {"logf", [](double x) { return std::log(x); }, 1e-6},
      {"__logf", [](double x) { return std::log(x); }, 1e-5},
      {"exp2f", [](double x) { return std::exp2(x); }, 1e-6},
      {"log1pf", [](double x) { return std::log1p(x); }, 1e-6},
      {"sqrtf", [](double x) { return std::sqrt(x); }, 1e-7},
      {"rsqrtf", [](double x) { return 1.0 / std::sqrt(x); }, 1e-6},
      {"tanhf", [](double x) { return std::tanh(x); }, 1e-6},
      {"erff", [](double x) { return std::erf(x); }, 1e-6},
      {"fmaxf", [](double x) { return std::fmax(x, 1.0); }, 0},
      {"fminf", [](double x) { return std::fmin(x, 1.0); }, 0},
      {"fabsf", [](double x) { return std::fabs(x); }, 0},
      {"floorf", [](double x) { return std::floor(x); }, 0},
      {"ceilf", [](double x) { return std::ceil(x); }, 0},
      {"powf", [](double x) { return std::pow(x, 1.5); }, 1e-6},
      {"__fdividef", [](double x) { return 1.0 / x; }, 1e-6},
      {"fmaf", [](double x) { return x * 2.0 + 1.0; }, 1e-7},
      {"isnan", [](double) { return 1.0; }, 0},
      {"isinf", [](double) { return 1.0; }, 0},
      {"bit casts, min, max", [](double x) { return x + 2.0; }, 1e-7},
  };
  for (int i = 0; i < n; ++i) {
    // The reference sees the float input exactly.
    const double x = in[i];
    for (int f = 0; f < kMathFunctions; ++f) {
      const double want = refs[f].f(x);
      EXPECT_NEAR(out[i * kMathFunctions + f], want, refs[f].relative_tolerance * std::fabs(want))
          << refs[f].name << "(" << x << ")";
    }
  }
}

TEST(MathTest, VectorTypesRoundTrip) {
  const int n = 300;
  std::vector<float4> in(n);
  for (int i = 0; i < n; ++i) in[i] = make_float4(i, -i, 0.5f * i, 2.0f * i);
  DeviceBuffer<float4> d_in(in);
  DeviceBuffer<float4> d_out(n);
  ASSERT_TRUE(CudaOk(LaunchVectorTypes(d_in.get(), d_out.get(), n, nullptr)));
  const std::vector<float4> out = d_out.ToHost();
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(out[i].x, in[i].x + 2.0f) << i;
    EXPECT_EQ(out[i].y, in[i].y + 6.0f) << i;
    EXPECT_EQ(out[i].z, in[i].z + 0.5f) << i;
    EXPECT_EQ(out[i].w, in[i].w + 20.0f) << i;
  }
}

}  // namespace
}  // namespace dcf::cuda_test
