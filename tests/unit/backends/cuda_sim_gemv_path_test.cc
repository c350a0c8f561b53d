// The CUDA backend's GEMV path (DCF_SIM_GEMV=1, as on a GPU: products of <= 16 rows run
// LaunchGemv with the norm in its prologue, SwiGLU / GELU in its epilogue and the final norm
// gathering the rows that need logits into the logits GEMV) against its library path, through
// whole steps of small random models: dcformer and dcpythia (LayerNorm prologues with a bias,
// GELU, the parallel block), with float32 weights and with int8 and fp8 ones (the quantized
// GEMV, gemv_kernel.cuh, against the library's decoded panels and scale epilogue,
// gemm_quant.h). float32 compute: the two paths differ only in the order of their f32 sums.
// Models this small keep the emulated grids cheap (seconds), so these run under ASan too
// (scripts/sanitizers.sh), where the golden-model GEMV tests are too slow to.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "engine/backends/backend_factory.h"
#include "engine/execution/step_batch.h"
#include "engine/kv/kv_cache_manager.h"
#include "engine/model/random_model.h"
#include "engine/sampling/sampling_params.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

namespace dcf {
namespace {

struct Case {
  std::string name;
  bool pythia;
  WeightQuant quant;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

nlohmann::json Config(bool pythia) {
  // dim 64, 2 layers (layer 0 a window of 8, layer 1 global), 4 heads, ffn 128, vocab 160.
  nlohmann::json c = SmallDcFormerConfig(64, 2, 4, 128, 160, 64, 8);
  if (pythia) {
    c["architectures"] = {"DCPythia"};
    c["model_type"] = "dcpythia";
    c["rotary_pct"] = 0.25;
    c["use_parallel_residual"] = true;
    c["use_linear_bias"] = true;
  }
  return c;
}

struct StepsResult {
  std::vector<int32_t> tokens, top_tokens;
  std::vector<float> logprobs, top_logprobs, logits;
};

// Two steps of three sequences: prompt chunks where sequence 1 returns all its logits and the
// others are only sampled (a gather that is not the identity), then a decode step in the
// reverse order.
StepsResult Steps(const std::string& dir, WeightQuant quant, bool gemv) {
  StepsResult r;
  BackendOptions o;
  o.kind = BackendKind::kCudaSim;
  o.dtype = DType::kF32;
  o.weight_quant = quant;
  // Read when the backend is created; cleared for the library run even where the
  // environment of the test sets it.
  if (gemv) {
    setenv("DCF_SIM_GEMV", "1", 1);
  } else {
    unsetenv("DCF_SIM_GEMV");
  }
  auto model = LoadModel(dir, o);
  unsetenv("DCF_SIM_GEMV");
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return r;
  EXPECT_EQ(model->backend->info().channel_quant, quant);
  Backend& backend = *model->backend;
  StepLimits limits;
  limits.max_tokens = 16;
  limits.max_seqs = 3;
  limits.max_logit_rows = 16;
  limits.blocks_per_seq = 16;
  EXPECT_TRUE(backend.Prepare(limits).ok());
  KvCacheShape shape;
  shape.block_size = 4;
  shape.window = model->config.window_size;
  shape.num_blocks = {48, 48};
  EXPECT_TRUE(backend.AllocateCache(shape).ok());
  KvCacheManager manager(shape);
  SamplingRow row;
  row.params.temperature = 0.0f;
  row.logprob = true;
  row.top_logprobs = 3;
  std::vector<std::vector<int32_t>> feed = {
      {5, 17, 42, 7, 9}, {3, 1, 4, 1, 5, 9, 2, 140}, {8, 8, 6}};  // 16 tokens: the GEMV's most
  std::vector<SequenceKv> kv(3);
  for (int step = 0; step < 2; ++step) {
    std::vector<int> order = {0, 1, 2};
    if (step == 1) std::reverse(order.begin(), order.end());
    StepBatch b;
    b.Reset(limits.blocks_per_seq);
    for (int s : order) {
      const int n = static_cast<int>(feed[s].size());
      EXPECT_TRUE(manager.Reserve(kv[s], kv[s].num_tokens + n).ok());
      b.AddSequence(feed[s], kv[s], /*sample=*/true, row, /*return_logits=*/step == 0 && s == 1);
    }
    StepOutput out;
    const absl::Status stepped = backend.Step(b, &out);
    EXPECT_TRUE(stepped.ok()) << stepped;
    if (!stepped.ok()) return r;
    for (size_t i = 0; i < order.size(); ++i) {
      const int s = order[i];
      manager.Commit(kv[s], kv[s].num_tokens + static_cast<int>(feed[s].size()));
      feed[s] = {out.tokens[i]};
      r.tokens.push_back(out.tokens[i]);
      r.logprobs.push_back(out.logprobs[i]);
      for (int t = 0; t < 3; ++t) {
        r.top_tokens.push_back(out.top_tokens[i * kMaxTopLogprobs + t]);
        r.top_logprobs.push_back(out.top_logprobs[i * kMaxTopLogprobs + t]);
      }
    }
    r.logits.insert(r.logits.end(), out.logits.begin(), out.logits.end());
  }
  for (SequenceKv& k : kv) manager.Free(k);
  return r;
}

class CudaSimGemvPathTest : public ::testing::TestWithParam<Case> {};

TEST_P(CudaSimGemvPathTest, WholeStepsMatchTheLibraryPath) {
  if (!CudaSimBackendBuilt()) GTEST_SKIP() << "this build has no cuda-sim backend";
  testing::TempDir dir;
  ASSERT_TRUE(WriteRandomModel(dir.path(), Config(GetParam().pythia), DType::kF32, 7).ok());
  const StepsResult library = Steps(dir.path(), GetParam().quant, false);
  const StepsResult gemv = Steps(dir.path(), GetParam().quant, true);
  ASSERT_EQ(library.tokens.size(), 6u);
  EXPECT_EQ(gemv.tokens, library.tokens);
  EXPECT_EQ(gemv.top_tokens, library.top_tokens);
  ASSERT_EQ(gemv.logprobs.size(), library.logprobs.size());
  for (size_t i = 0; i < library.logprobs.size(); ++i) {
    EXPECT_NEAR(gemv.logprobs[i], library.logprobs[i], 1e-4) << i;
  }
  ASSERT_EQ(gemv.top_logprobs.size(), library.top_logprobs.size());
  for (size_t i = 0; i < library.top_logprobs.size(); ++i) {
    EXPECT_NEAR(gemv.top_logprobs[i], library.top_logprobs[i], 1e-4) << i;
  }
  ASSERT_EQ(library.logits.size(), 8u * 160);  // sequence 1's prompt rows, returned at step 0
  ASSERT_EQ(gemv.logits.size(), library.logits.size());
  double worst = 0, largest = 0;
  for (size_t i = 0; i < library.logits.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(gemv.logits[i] - library.logits[i])));
    largest = std::max(largest, static_cast<double>(std::abs(library.logits[i])));
  }
  EXPECT_LT(worst, 1e-4 * std::max(1.0, largest)) << "largest |logit| " << largest;
  EXPECT_GT(largest, 0.1);  // the logits are not all zero (the bound above could not fail)
  // Three different sequences: not one token everywhere.
  EXPECT_GT(std::set<int32_t>(library.tokens.begin(), library.tokens.end()).size(), 2u);
}

INSTANTIATE_TEST_SUITE_P(
    Models, CudaSimGemvPathTest,
    ::testing::Values(Case{"dcformer_dense", false, WeightQuant::kNone},
                      Case{"dcformer_int8", false, WeightQuant::kInt8},
                      Case{"dcformer_fp8", false, WeightQuant::kFp8},
                      Case{"dcpythia_dense", true, WeightQuant::kNone},
                      Case{"dcpythia_int8", true, WeightQuant::kInt8}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace dcf
