// The CUDA backend's GEMM plans (gemm_plan.h) on cuda-sim with the golden models: Prepare
// makes a plan for every m bucket of every product a step within the limits hands the
// library, so steps of any length (prefill chunks of many sizes, decode, logits of every
// row) build none; the emulator keeps the library build's bookkeeping. And the tokens do
// not depend on the chunking that picks the buckets (the plans change nothing they must not).
#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "engine/cuda/cuda_backend.h"
#include "engine/model/model_weights.h"
#include "engine/serving/sequence_runner.h"
#include "engine/weights/checkpoint.h"
#include "gtest/gtest.h"
#include "tests/testing/golden.h"
#include "tests/testing/golden_cuda_sim.h"

namespace dcf {
namespace {

std::unique_ptr<cuda::CudaBackend> LoadCudaSim(const std::string& model) {
  return testing::LoadGoldenCudaSim(model);
}

class CudaGemmPlansTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaGemmPlansTest, StepsOfEveryLengthBuildNoPlan) {
  const testing::Golden golden = testing::LoadGolden(GetParam());
  std::unique_ptr<cuda::CudaBackend> backend = LoadCudaSim(GetParam());
  ASSERT_NE(backend, nullptr);
  auto runner = SequenceRunner::Create(backend.get());  // Prepare: the whole context per step
  ASSERT_TRUE(runner.ok()) << runner.status();
  const cuda::Gemm::Stats prepared = backend->gemm_stats();
  EXPECT_EQ(prepared.cached_plans, 0);
  EXPECT_EQ(prepared.plans_built_on_use, 0);
  // One pinned plan per bucket of 1..context rows of each distinct product shape.
  std::set<std::tuple<int, int, bool, bool>> shapes;
  for (const cuda::GemmPlanChoice& c : backend->gemm_choices()) {
    shapes.insert({c.key.n, c.key.k, c.key.bias, c.key.accumulate});
  }
  const int context = backend->config().max_positions;
  EXPECT_EQ(prepared.pinned_plans,
            static_cast<int>(shapes.size() * cuda::GemmBucketsFor(1, context).size()));
  EXPECT_GE(shapes.size(), 5u);  // in, Wo, up, down, logits (the golden models share none)

  // Prefill chunks of many sizes, logits of every row (the logits product at every m), then
  // greedy decode.
  std::vector<float> logits;
  const std::vector<int32_t>& p = golden.prompt;
  size_t at = 0;
  for (int chunk : {1, 2, 3, 5, 8, 13, 21, 34}) {
    if (at >= p.size()) break;
    const size_t n = std::min(p.size() - at, static_cast<size_t>(chunk));
    ASSERT_TRUE((*runner)->Append({p.data() + at, n}, chunk, &logits).ok());
    at += n;
  }
  (*runner)->Reset();
  auto chunked = (*runner)->Greedy(golden.prompt, 6, 7);
  ASSERT_TRUE(chunked.ok()) << chunked.status();
  (*runner)->Reset();
  auto whole = (*runner)->Greedy(golden.prompt, 6, static_cast<int>(golden.prompt.size()));
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(chunked->tokens, whole->tokens);
  EXPECT_EQ(backend->gemm_stats().plans_built_on_use, 0);
  EXPECT_EQ(backend->gemm_stats().cached_plans, 0);
  EXPECT_EQ(backend->gemm_stats().pinned_plans, prepared.pinned_plans);
}

INSTANTIATE_TEST_SUITE_P(Golden, CudaGemmPlansTest, ::testing::Values("dcformer-f32-short-prompt", "dcpythia-f16-bin"),
                         testing::GoldenParamName);

}  // namespace
}  // namespace dcf
