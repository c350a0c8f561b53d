// The CPU engine against the reference implementation's outputs (tests/data/golden): every
// logit within 1e-4 and the same greedy continuation, whichever way the sequence is fed and
// whether 16-bit weights are kept (widened in the kernels) or widened at load. CTest runs
// the cases twice: with the best kernels this CPU has, and with DCF_CPU_ISA=portable.
#include <cmath>
#include <optional>

#include "engine/backends/backend_factory.h"
#include "engine/model/sequence_runner.h"
#include "gtest/gtest.h"
#include "tests/testing/golden.h"

namespace dcf {
namespace {

constexpr double kLogitTolerance = 1e-4;

struct GoldenParam {
  std::string name;
  int chunk;  // tokens per forward step; 0 = the whole sequence at once
  // BackendOptions::dtype: nullopt keeps the checkpoint's dtype (its 16-bit weights are then
  // widened inside the matmul kernels), float32 widens them at load.
  std::optional<DType> dtype;
};

void PrintTo(const GoldenParam& p, std::ostream* os) {
  *os << p.name << " chunk " << p.chunk;
  if (p.dtype) *os << " as " << ComputeDTypeName(*p.dtype);
}

std::string ParamName(const ::testing::TestParamInfo<GoldenParam>& info) {
  std::string n = info.param.name + "_chunk" + std::to_string(info.param.chunk);
  if (info.param.dtype) n += std::string("_as_") + ComputeDTypeName(*info.param.dtype);
  for (char& c : n) {
    if (c == '-') c = '_';
  }
  return n;
}

class GoldenTest : public ::testing::TestWithParam<GoldenParam> {
 protected:
  void SetUp() override {
    BackendOptions options;
    options.kind = BackendKind::kCpu;
    options.dtype = GetParam().dtype;
    auto m = LoadModel(testing::GoldenDir(GetParam().name), options);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    golden_ = testing::LoadGolden(GetParam().name);
    auto r = SequenceRunner::Create(model_.backend.get());
    ASSERT_TRUE(r.ok()) << r.status();
    runner_ = std::move(*r);
  }
  int Chunk(size_t total) const {
    return GetParam().chunk == 0 ? static_cast<int>(total) : GetParam().chunk;
  }

  LoadedModel model_;
  testing::Golden golden_;
  std::unique_ptr<SequenceRunner> runner_;
};

TEST_P(GoldenTest, AllLogitsMatchReference) {
  std::vector<float> logits;
  ASSERT_TRUE(runner_->Append(golden_.sequence, Chunk(golden_.sequence.size()), &logits).ok());
  const int V = model_.config.vocab_size;
  ASSERT_EQ(logits.size(), golden_.sequence.size() * V);
  double worst = 0;
  for (size_t t = 0; t < golden_.sequence.size(); ++t) {
    for (int v = 0; v < V; ++v) {
      const double diff = std::abs(logits[t * V + v] - golden_.logits[t][v]);
      worst = std::max(worst, diff);
      ASSERT_LE(diff, kLogitTolerance) << "position " << t << " vocab " << v;
    }
  }
  RecordProperty("max_abs_logit_error", std::to_string(worst));
}

TEST_P(GoldenTest, GreedyContinuationMatchesReference) {
  auto result = runner_->Greedy(golden_.prompt, static_cast<int>(golden_.greedy.size()),
                                Chunk(golden_.prompt.size()));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->tokens, golden_.greedy);
  ASSERT_EQ(result->logprobs.size(), golden_.greedy_logprobs.size());
  for (size_t i = 0; i < result->logprobs.size(); ++i) {
    EXPECT_NEAR(result->logprobs[i], golden_.greedy_logprobs[i], kLogitTolerance) << i;
  }
}

std::vector<GoldenParam> AllParams() {
  std::vector<GoldenParam> params;
  for (const std::string& name : testing::GoldenCases()) {
    for (int chunk : {0, 1, 5, 16}) params.push_back({name, chunk, std::nullopt});
  }
  // The F16 checkpoint widened to float32 at load gives the same outputs.
  for (int chunk : {0, 5}) params.push_back({"dcpythia-f16-bin", chunk, DType::kF32});
  return params;
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenTest, ::testing::ValuesIn(AllParams()), ParamName);

}  // namespace
}  // namespace dcf
