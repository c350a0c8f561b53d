// LaunchAttentionInput (the fused kernel after the input projection) against the three
// kernels it replaces, run one after another on the same inputs: LaunchQkRope,
// LaunchDynWeights and LaunchKvCacheWrite. Same arithmetic in the same order, so the
// projection rows (q, k rotated; gates), the dynamic weights and every byte of the cache
// must be identical, for decode tokens and prefill chunks, window layers (rows that are not
// kept stay untouched), missing blocks, qkw in f32 and 16 bits, each cache dtype.
#include "engine/cuda/attention_input.h"

#include <cstring>
#include <string>
#include <vector>

#include "engine/cuda/dyn_weights.h"
#include "engine/cuda/qk_rope.h"
#include "engine/execution/step_plan.h"
#include "gtest/gtest.h"
#include "tests/unit/cuda/kernel_test_util.h"

namespace dcf::cuda_test {
namespace {

using cuda::ElemType;

struct InputCase {
  int n_head, head_dim, rotary_dim;
  bool qk_norm;
  int window;
  ElemType cache, qkw;
};

std::string Name(const ::testing::TestParamInfo<InputCase>& info) {
  const InputCase& c = info.param;
  std::string name = "N";
  name += std::to_string(c.n_head);
  name += "_hd";
  name += std::to_string(c.head_dim);
  name += "_r";
  name += std::to_string(c.rotary_dim);
  if (c.qk_norm) name += "_qknorm";
  name += c.window > 0 ? "_W" + std::to_string(c.window) : std::string("_global");
  name += "_cache";
  name += TypeName(c.cache);
  name += "_qkw";
  name += TypeName(c.qkw);
  return name;
}

class AttentionInputTest : public ::testing::TestWithParam<InputCase> {};

TEST_P(AttentionInputTest, IsBitIdenticalToTheKernelsItReplaces) {
  const InputCase c = GetParam();
  const int N = c.n_head, hd = c.head_dim, E = N * hd, K = 4 * N, C = cuda::kBranches;
  const int W = 2 * cuda::kRank * N, half = c.rotary_dim / 2;
  // Sequences (start, new tokens): decode tokens and chunks, one reaching past the window.
  const std::vector<std::pair<int, int>> seqs = {{0, 6}, {9, 1}, {30, 1}, {12, 13}, {3, 2}};
  std::vector<int32_t> positions, token_seq, offsets = {0};
  int max_end = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (int i = 0; i < seqs[s].second; ++i) {
      positions.push_back(seqs[s].first + i);
      token_seq.push_back(static_cast<int32_t>(s));
    }
    offsets.push_back(static_cast<int32_t>(positions.size()));
    max_end = std::max(max_end, seqs[s].first + seqs[s].second);
  }
  const int T = static_cast<int>(positions.size()), S = static_cast<int>(seqs.size());
  // Cache: 2 layers per block, the step writes layer 1; block size 4; shuffled physical
  // blocks, some logical blocks missing.
  const int B = 4, layers = 2, row = 2 * E + 2 * (2 * cuda::kRank + 1) * N;
  const int bps = (max_end + B - 1) / B;
  std::vector<int32_t> table(static_cast<size_t>(S) * bps);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>((i * 7) % table.size());
  table[1] = -1;                // sequence 0, positions 4..7: no block
  table[3 * bps + 2] = -1;      // sequence 3, positions 8..11
  const int num_blocks = static_cast<int>(table.size());
  const size_t cache_elems = static_cast<size_t>(num_blocks) * layers * B * row;

  const int64_t u_off = 3 * E, g_off = u_off + C * K, stride = g_off + C * N + 3;
  const std::vector<float> proj = RandomVector(static_cast<size_t>(T) * stride, 61, -2, 2);
  const std::vector<float> qkw = RandomVector(static_cast<size_t>(C) * K * W, 62, -0.3f, 0.3f);
  const std::vector<float> qn = RandomVector(hd, 63, 0.5, 1.5), kn = RandomVector(hd, 64, 0.5, 1.5);
  const int max_pos = max_end + 1;
  std::vector<float> cs(static_cast<size_t>(max_pos) * std::max(half, 1));
  std::vector<float> sn(cs.size());
  for (int p = 0; p < max_pos; ++p) {
    RopeAngles(p, c.rotary_dim, 10000.0, &cs[p * half], &sn[p * half]);
  }
  const std::vector<uint8_t> cache_init(cache_elems * cuda::ElemBytes(c.cache), 0xFF);

  DeviceBuffer<int32_t> dpos(positions), dseq(token_seq), doff(offsets), dtable(table);
  DeviceBuffer<float> dcs(cs), dsn(sn), dqn(qn), dkn(kn);
  const TypedBuffer dqkw(qkw, c.qkw);
  struct Run {
    DeviceBuffer<float> proj, dyn;
    DeviceBuffer<uint8_t> cache;
  };
  auto make_run = [&] {
    return std::unique_ptr<Run>(new Run{DeviceBuffer<float>(proj),
                                        DeviceBuffer<float>(std::vector<float>(T * C * W, -7.0f)),
                                        DeviceBuffer<uint8_t>(cache_init)});
  };
  auto plain = make_run(), fused = make_run();

  cuda::StepView sv;
  sv.num_tokens = T;
  sv.num_seqs = S;
  sv.positions = dpos.get();
  sv.seq_offsets = doff.get();
  sv.token_seq = dseq.get();
  sv.blocks_per_seq = bps;
  sv.max_seq_tokens = 13;
  sv.max_position = max_end - 1;
  auto params = [&](Run& r) {
    cuda::AttentionInputParams p;
    p.rope.num_tokens = T;
    p.rope.n_head = N;
    p.rope.head_dim = hd;
    p.rope.rotary_dim = c.rotary_dim;
    p.rope.qkv = r.proj.get();
    p.rope.stride = stride;
    if (c.qk_norm) {
      p.rope.q_norm = dqn.get();
      p.rope.k_norm = dkn.get();
    }
    p.rope.positions = dpos.get();
    p.rope.cos_table = dcs.get();
    p.rope.sin_table = dsn.get();
    p.dyn.num_tokens = T;
    p.dyn.n_head = N;
    p.dyn.proj = r.proj.get();
    p.dyn.stride = stride;
    p.dyn.u_offset = u_off;
    p.dyn.g_offset = g_off;
    p.dyn.qkw = dqkw.get();
    p.dyn.qkw_type = c.qkw;
    p.dyn.dyn = r.dyn.get();
    p.dyn.dyn_stride = C * W;
    p.step = sv;
    p.cache = {r.cache.get(), c.cache, num_blocks, layers, B, row, dtable.get()};
    p.window = c.window;
    p.layer_in_group = 1;
    return p;
  };

  // The plain path: three launches.
  const cuda::AttentionInputParams pp = params(*plain);
  ASSERT_TRUE(CudaOk(cuda::LaunchQkRope(pp.rope, nullptr)));
  ASSERT_TRUE(CudaOk(cuda::LaunchDynWeights(pp.dyn, nullptr)));
  cuda::DcmhaLayerArgs a;
  a.n_head = N;
  a.head_dim = hd;
  a.window = c.window;
  a.layer_in_group = 1;
  a.qkv = plain->proj.get();
  a.qkv_stride = stride;
  a.dyn = plain->dyn.get();
  a.dyn_stride = C * W;
  a.gates = plain->proj.get() + g_off;
  a.gates_stride = stride;
  a.cache = pp.cache;
  ASSERT_TRUE(CudaOk(cuda::LaunchKvCacheWrite(sv, a, nullptr)));
  // The fused kernel.
  ASSERT_TRUE(CudaOk(cuda::LaunchAttentionInput(params(*fused), nullptr)));
  ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));

  const std::vector<float> proj_plain = plain->proj.ToHost(), proj_fused = fused->proj.ToHost();
  const std::vector<float> dyn_plain = plain->dyn.ToHost(), dyn_fused = fused->dyn.ToHost();
  const std::vector<uint8_t> cache_plain = plain->cache.ToHost(),
                             cache_fused = fused->cache.ToHost();
  EXPECT_EQ(0, std::memcmp(proj_plain.data(), proj_fused.data(), proj_plain.size() * 4));
  EXPECT_EQ(0, std::memcmp(dyn_plain.data(), dyn_fused.data(), dyn_plain.size() * 4));
  EXPECT_EQ(0, std::memcmp(cache_plain.data(), cache_fused.data(), cache_plain.size()));
  // The comparison can fail: the step rotated q and k, wrote the cache and left rows alone.
  EXPECT_NE(0, std::memcmp(proj_fused.data(), proj.data(), proj.size() * 4));
  EXPECT_NE(cache_fused, cache_init);
  size_t untouched = 0;
  for (uint8_t b : cache_fused) untouched += b == 0xFF;
  EXPECT_GT(untouched, cache_fused.size() / 4);  // the other layer, missing and dropped rows
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionInputTest,
    ::testing::Values(
        InputCase{4, 16, 16, true, 0, ElemType::kF32, ElemType::kF32},       // golden models
        InputCase{4, 16, 16, true, 8, ElemType::kBF16, ElemType::kBF16},
        InputCase{32, 80, 80, true, 8, ElemType::kBF16, ElemType::kBF16},    // DCFormer-2.8B
        InputCase{8, 128, 32, true, 0, ElemType::kF16, ElemType::kF16},      // rotary_pct 0.25
        InputCase{40, 8, 8, false, 6, ElemType::kF32, ElemType::kBF16}),     // N > 32
    Name);

TEST(AttentionInput, RefusesInconsistentArguments) {
  cuda::AttentionInputParams p;
  p.rope.num_tokens = 1;
  p.rope.n_head = 4;
  p.rope.head_dim = 16;
  p.rope.rotary_dim = 16;
  float dummy[4] = {};
  int32_t pos[1] = {0};
  p.rope.qkv = dummy;
  p.rope.positions = pos;
  p.rope.cos_table = dummy;
  p.rope.sin_table = dummy;
  p.dyn.num_tokens = 1;
  p.dyn.n_head = 4;
  p.dyn.proj = dummy;
  p.dyn.qkw = dummy;
  p.dyn.dyn = dummy;
  cuda::AttentionInputParams bad = p;
  bad.dyn.n_head = 5;
  EXPECT_EQ(cuda::LaunchAttentionInput(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.rope.rotary_dim = 15;
  EXPECT_EQ(cuda::LaunchAttentionInput(bad, nullptr), cudaErrorInvalidValue);
  bad = p;
  bad.cache.base = dummy;  // a cache without a consistent row layout
  bad.cache.block_size = 4;
  bad.cache.layers_in_group = 1;
  bad.cache.row_elems = 3;
  EXPECT_EQ(cuda::LaunchAttentionInput(bad, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace dcf::cuda_test
