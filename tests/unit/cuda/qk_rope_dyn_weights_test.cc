// qk-norm + RoPE and the dynamic-weight tail against host references built from the CPU
// ops (cpu::ApplyRope, RopeAngles of the step plan, cpu::GeluErf; a host matmul) and the formulas of
// engine/cpu/cpu_backend.cc.
#include <cmath>

#include "engine/cpu/cpu_ops.h"
#include "engine/cuda/dyn_weights.h"
#include "engine/cuda/qk_rope.h"
#include "engine/execution/step_plan.h"
#include "gtest/gtest.h"
#include "tests/unit/cuda/kernel_test_util.h"

namespace dcf::cuda_test {
namespace {

struct RopeCase {
  int n_head, head_dim, rotary_dim;
  bool qk_norm;
};

class QkRopeTest : public ::testing::TestWithParam<RopeCase> {};

TEST_P(QkRopeTest, MatchesCpu) {
  const RopeCase c = GetParam();
  const int N = c.n_head, hd = c.head_dim, r = c.rotary_dim, half = r / 2, E = N * hd;
  const int T = 6, max_pos = 300;
  const int64_t stride = 3 * E + 40;  // more columns after q | k | v
  const std::vector<int32_t> positions = {0, 1, 2, 150, 151, 299};
  std::vector<float> qkv = RandomVector(T * stride, 21, -2, 2);
  const std::vector<float> qn = RandomVector(hd, 22, 0.5, 1.5), kn = RandomVector(hd, 23, 0.5, 1.5);
  std::vector<float> cs(max_pos * std::max(half, 1)), sn(max_pos * std::max(half, 1));
  for (int p = 0; p < max_pos; ++p) RopeAngles(p, r, 10000.0, &cs[p * half], &sn[p * half]);

  std::vector<float> want = qkv;
  for (int t = 0; t < T; ++t) {
    for (int v = 0; v < 2 * N; ++v) {
      float* x = &want[t * stride + v * hd];
      const float* scale = v < N ? qn.data() : kn.data();
      if (c.qk_norm) {
        float ss = 0;
        for (int d = 0; d < hd; ++d) ss += x[d] * x[d];
        const float inv = 1.0f / std::sqrt(ss / hd + 1e-6f);
        for (int d = 0; d < hd; ++d) x[d] = x[d] * inv * scale[d];
      }
      cpu::ApplyRope(x, r, &cs[positions[t] * half], &sn[positions[t] * half]);
    }
  }
  DeviceBuffer<float> dqkv(qkv), dqn(qn), dkn(kn), dcs(cs), dsn(sn);
  DeviceBuffer<int32_t> dpos(positions);
  cuda::QkRopeParams p;
  p.num_tokens = T;
  p.n_head = N;
  p.head_dim = hd;
  p.rotary_dim = r;
  p.qkv = dqkv.get();
  p.stride = stride;
  if (c.qk_norm) {
    p.q_norm = dqn.get();
    p.k_norm = dkn.get();
  }
  p.positions = dpos.get();
  p.cos_table = dcs.get();
  p.sin_table = dsn.get();
  ASSERT_TRUE(CudaOk(cuda::LaunchQkRope(p, nullptr)));
  const std::vector<float> got = dqkv.ToHost();
  EXPECT_LT(Nmse(got, want), 1e-12);
  EXPECT_LT(MaxAbs(got, want), 2e-5);
  for (int t = 0; t < T; ++t) {  // v and the columns after it are untouched
    for (int64_t i = 2 * E; i < stride; ++i) ASSERT_EQ(got[t * stride + i], qkv[t * stride + i]);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, QkRopeTest,
                         ::testing::Values(RopeCase{4, 80, 80, true},   // DCFormer-2.8B heads
                                           RopeCase{3, 128, 32, true},  // DCPythia rotary_pct
                                           RopeCase{5, 16, 16, false}, RopeCase{2, 256, 64, true}));

class DynWeightsTest : public ::testing::TestWithParam<int> {};

TEST_P(DynWeightsTest, MatchesCpu) {
  const int N = GetParam(), K = 4 * N, C = 4, I = 2, W = 2 * I * N;
  const int T = 9;  // not a multiple of the kernel's token tile
  const int64_t u_off = 17, g_off = u_off + C * K, stride = g_off + C * N + 5;
  const std::vector<float> proj = RandomVector(T * stride, 31, -3, 3);
  const std::vector<float> qkw = RandomVector(C * K * W, 32, -0.3, 0.3);

  std::vector<float> u(T * C * K), want_dyn(T * C * W), want_proj = proj;
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < C * K; ++i) u[t * C * K + i] = cpu::GeluErf(proj[t * stride + u_off + i]);
  }
  for (int c = 0; c < C; ++c) {
    RefMatMul(u.data() + c * K, C * K, qkw.data() + c * K * W, W, T, K, W,
                want_dyn.data() + c * W, C * W);
  }
  for (int t = 0; t < T; ++t) {
    for (int c = 0; c < C; ++c) {
      for (int i = 0; i < I; ++i) {
        float* w1 = &want_dyn[(t * C + c) * W + i * N];
        float ss = 0;
        for (int n = 0; n < N; ++n) ss += w1[n] * w1[n];
        const float inv = 1.0f / std::sqrt(ss / N + 1e-6f);
        for (int n = 0; n < N; ++n) w1[n] *= inv;
      }
    }
    for (int i = 0; i < C * N; ++i) {
      want_proj[t * stride + g_off + i] = std::tanh(proj[t * stride + g_off + i]);
    }
  }
  DeviceBuffer<float> dproj(proj), dqkw(qkw), ddyn(T * C * W);
  cuda::DynWeightsParams p;
  p.num_tokens = T;
  p.n_head = N;
  p.proj = dproj.get();
  p.stride = stride;
  p.u_offset = u_off;
  p.g_offset = g_off;
  p.qkw = dqkw.get();
  p.dyn = ddyn.get();
  p.dyn_stride = C * W;
  ASSERT_TRUE(CudaOk(cuda::LaunchDynWeights(p, nullptr)));
  const std::vector<float> dyn = ddyn.ToHost(), got_proj = dproj.ToHost();
  EXPECT_LT(Nmse(dyn, want_dyn), 1e-12);
  EXPECT_LT(MaxAbs(dyn, want_dyn), 1e-5);
  EXPECT_LT(MaxAbs(got_proj, want_proj), 1e-6);  // gates in place, the rest untouched
}

INSTANTIATE_TEST_SUITE_P(Heads, DynWeightsTest, ::testing::Values(8, 32, 40));

}  // namespace
}  // namespace dcf::cuda_test
