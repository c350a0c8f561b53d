// Every backend that runs on this machine against the reference implementation's outputs
// (tests/data/golden): the CPU backend, and the CUDA backend's kernels on the SIMT emulator
// (cuda-sim) in float32. Every logit within 1e-4 and the same greedy continuation with
// logprobs within 1e-4, whichever way the sequence is fed (whole, or in chunks of 1, 5, 16).
// The CPU keeps 16-bit checkpoints in 16 bits (widened inside the matmul kernels) or widens
// them at load: both match. CTest runs the CPU cases twice: with the best kernels this CPU
// has, and with DCF_CPU_ISA=portable. With 16-bit weights on cuda-sim (bfloat16 / float16)
// the agreement is measured and reported.
#include "tests/testing/golden.h"

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <optional>

#include "absl/strings/str_format.h"
#include "engine/backends/backend_factory.h"
#include "engine/serving/sequence_runner.h"
#include "gtest/gtest.h"

namespace dcf {
namespace {

constexpr double kLogitTolerance = 1e-4;
// int8 weight-only on the golden cases (Int8AgreementTest): the least share of rows whose
// argmax is the reference's, in every case and over all of them, at the default group size
// (measured: 51/52, 60/60, 52/52), and the largest logit error of any group size (measured:
// 0.026).
constexpr double kInt8MinAgreement = 0.98;
constexpr double kInt8MaxLogitError = 0.1;

struct GoldenParam {
  std::string name;
  int chunk;  // tokens per forward step; 0 = the whole sequence at once
  BackendKind backend;
  // BackendOptions::dtype for the CPU: nullopt keeps the checkpoint's dtype (16-bit weights
  // are then widened inside the matmul kernels), float32 widens them at load. cuda-sim always
  // computes in float32 here.
  std::optional<DType> dtype;
};

void PrintTo(const GoldenParam& p, std::ostream* os) {
  *os << BackendKindName(p.backend) << " " << p.name << " chunk " << p.chunk;
  if (p.dtype) *os << " as " << ComputeDTypeName(*p.dtype);
}

std::string ParamName(const ::testing::TestParamInfo<GoldenParam>& info) {
  std::string n = std::string(BackendKindName(info.param.backend)) + "_" + info.param.name +
                  "_chunk" + std::to_string(info.param.chunk);
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
    options.kind = GetParam().backend;
    options.dtype = GetParam().backend == BackendKind::kCpu ? GetParam().dtype
                                                            : std::optional<DType>(DType::kF32);
    auto m = LoadModel(testing::GoldenDir(GetParam().name), options);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    ASSERT_EQ(model_.backend->info().name, BackendKindName(GetParam().backend));
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
  for (BackendKind backend : {BackendKind::kCpu, BackendKind::kCudaSim}) {
    for (const std::string& name : testing::GoldenCases()) {
      for (int chunk : {0, 1, 5, 16}) params.push_back({name, chunk, backend, std::nullopt});
    }
  }
  // The F16 checkpoint widened to float32 at load gives the same outputs.
  for (int chunk : {0, 5}) {
    params.push_back({"dcpythia-f16-bin", chunk, BackendKind::kCpu, DType::kF32});
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenTest, ::testing::ValuesIn(AllParams()), ParamName);

// The CUDA kernels with 16-bit weights and GEMM inputs (f32 everywhere else), teacher-forced
// over each golden sequence: the largest logit error against the reference and how often
// each row's argmax is the reference's. Printed for the record; the bounds only catch a
// broken 16-bit path (the golden models have random weights: their logits are nearly flat,
// so argmax margins are small and 16-bit rounding flips some).
// Teacher-forced agreement of one backend with a golden case's reference logits: the
// backend reads the whole sequence (chunks of 16) and each row is compared.
struct Agreement {
  double worst = 0;   // largest |logit error|
  double spread = 0;  // largest logit range of a reference row
  int agree = 0;      // rows whose argmax is the reference's
  int rows = 0;
};

void MeasureAgreement(const std::string& name, const BackendOptions& options, Agreement* out,
                      int chunk = 16) {
  auto m = LoadModel(testing::GoldenDir(name), options);
  ASSERT_TRUE(m.ok()) << m.status();
  // The backend runs what was asked for, so the agreement measures that.
  if (options.dtype.has_value()) {
    ASSERT_EQ(m->backend->info().dtype, *options.dtype);
  }
  if (options.kind == BackendKind::kCpu && options.weight_quant == WeightQuant::kInt8) {
    ASSERT_EQ(m->backend->info().int8_weight_group, options.weight_group_size);
  }
  if (options.kind == BackendKind::kCudaSim) {
    ASSERT_EQ(m->backend->info().channel_quant, options.weight_quant);
  }
  ASSERT_EQ(m->backend->info().int8_activations,
            options.activation_quant == ActivationQuant::kInt8);
  ASSERT_EQ(m->backend->info().fp8_activations,
            options.activation_quant == ActivationQuant::kFp8);
  const testing::Golden g = testing::LoadGolden(name);
  auto runner = SequenceRunner::Create(m->backend.get());
  ASSERT_TRUE(runner.ok());
  std::vector<float> logits;
  ASSERT_TRUE((*runner)->Append(g.sequence, chunk, &logits).ok());
  const int V = m->config.vocab_size;
  Agreement a;
  a.rows = static_cast<int>(g.sequence.size());
  for (size_t t = 0; t < g.sequence.size(); ++t) {
    int best = 0, want = 0;
    double lo = 1e30, hi = -1e30;
    for (int v = 0; v < V; ++v) {
      a.worst = std::max(a.worst, std::abs(logits[t * V + v] - g.logits[t][v]));
      if (logits[t * V + v] > logits[t * V + best]) best = v;
      if (g.logits[t][v] > g.logits[t][want]) want = v;
      lo = std::min(lo, g.logits[t][v]);
      hi = std::max(hi, g.logits[t][v]);
    }
    a.spread = std::max(a.spread, hi - lo);
    a.agree += best == want;
  }
  *out = a;
}

class SixteenBitAgreementTest : public ::testing::TestWithParam<DType> {};

TEST_P(SixteenBitAgreementTest, CudaSimAgreesWithReference) {
  for (const std::string& name : testing::GoldenCases()) {
    BackendOptions options;
    options.kind = BackendKind::kCudaSim;
    options.dtype = GetParam();
    Agreement a;
    ASSERT_NO_FATAL_FAILURE(MeasureAgreement(name, options, &a));
    const std::string line = absl::StrFormat(
        "cuda-sim %s %s: max |logit error| %.4f (logit range %.2f), argmax agreement %d/%d",
        ComputeDTypeName(GetParam()), name, a.worst, a.spread, a.agree, a.rows);
    std::cout << line << "\n";
    RecordProperty(name + "_max_abs_logit_error", std::to_string(a.worst));
    RecordProperty(name + "_argmax_agreement", absl::StrFormat("%d/%d", a.agree, a.rows));
    const double bound = GetParam() == DType::kBF16 ? 0.05 : 0.01;
    EXPECT_LT(a.worst, bound) << line;
    EXPECT_GE(a.agree, static_cast<int>(a.rows * 0.9)) << line;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SixteenBitAgreementTest,
                         ::testing::Values(DType::kBF16, DType::kF16), [](const auto& info) {
                           return std::string(ComputeDTypeName(info.param));
                         });


// int8 weight-only matrices on the CPU (--weight-dtype int8, docs/QUANTIZATION.md), every
// group size, teacher-forced over each golden sequence: how often each row's argmax is the
// reference's, and the largest logit error. The bound is 98% agreement for the
// default group size; the golden models' random weights give nearly flat logits, so this is
// the hard case for it (a trained model's margins are wider: kjv_model_test).
class Int8AgreementTest : public ::testing::TestWithParam<int> {};

TEST_P(Int8AgreementTest, CpuInt8WeightsAgreeWithReference) {
  int agree_all = 0, rows_all = 0;
  for (const std::string& name : testing::GoldenCases()) {
    BackendOptions options;
    options.kind = BackendKind::kCpu;
    options.weight_quant = WeightQuant::kInt8;
    options.weight_group_size = GetParam();
    Agreement a;
    ASSERT_NO_FATAL_FAILURE(MeasureAgreement(name, options, &a));
    agree_all += a.agree;
    rows_all += a.rows;
    const std::string line =
        absl::StrFormat("cpu int8 g%d %s: max |logit error| %.4f, argmax agreement %d/%d",
                        GetParam(), name, a.worst, a.agree, a.rows);
    std::cout << line << "\n";
    RecordProperty(name + "_argmax_agreement", absl::StrFormat("%d/%d", a.agree, a.rows));
    // A broken int8 path (wrong scale, wrong group) moves logits by O(1) and agrees at chance.
    EXPECT_LT(a.worst, kInt8MaxLogitError) << line;
    if (GetParam() == kDefaultWeightGroupSize) {
      EXPECT_GE(a.agree, kInt8MinAgreement * a.rows) << line;
    }
  }
  std::cout << absl::StrFormat("cpu int8 g%d all golden cases: argmax agreement %d/%d\n",
                               GetParam(), agree_all, rows_all);
  if (GetParam() == kDefaultWeightGroupSize) {
    EXPECT_GE(agree_all, kInt8MinAgreement * rows_all) << agree_all << "/" << rows_all;
  }
}

INSTANTIATE_TEST_SUITE_P(GroupSizes, Int8AgreementTest, ::testing::Values(32, 64, 128),
                         [](const auto& info) { return "g" + std::to_string(info.param); });

// int8 x int8 (--activation-dtype int8, default group size), teacher-forced over each golden
// sequence. The issue asks only for the numbers; the bounds catch a broken path (a wrong
// activation scale or sum moves logits by O(1) and agrees at chance), with the rounding of
// the activations on top of the weights' room for both.
TEST(Int8ActivationsAgreementTest, CpuInt8x8AgreesWithReference) {
  int agree_all = 0, rows_all = 0;
  for (const std::string& name : testing::GoldenCases()) {
    BackendOptions options;
    options.kind = BackendKind::kCpu;
    options.weight_quant = WeightQuant::kInt8;
    options.activation_quant = ActivationQuant::kInt8;
    Agreement a;
    ASSERT_NO_FATAL_FAILURE(MeasureAgreement(name, options, &a));
    agree_all += a.agree;
    rows_all += a.rows;
    const std::string line =
        absl::StrFormat("cpu int8 x int8 g%d %s: max |logit error| %.4f, argmax agreement %d/%d",
                        kDefaultWeightGroupSize, name, a.worst, a.agree, a.rows);
    std::cout << line << "\n";
    RecordProperty(name + "_argmax_agreement", absl::StrFormat("%d/%d", a.agree, a.rows));
    EXPECT_LT(a.worst, 2 * kInt8MaxLogitError) << line;
  }
  std::cout << absl::StrFormat("cpu int8 x int8 all golden cases: argmax agreement %d/%d\n",
                               agree_all, rows_all);
  EXPECT_GE(agree_all, 0.9 * rows_all) << agree_all << "/" << rows_all;
}

// int8 and fp8 E4M3 weights on cuda-sim (per output channel; docs/QUANTIZATION.md "GPU"),
// teacher-forced over each golden sequence, in float32 (the weights' rounding alone) and
// bfloat16 (the GPU default): on the library path (chunks of 32, as prefill: the decoded
// panels' GEMM, or with fp8 activations the FP8 GEMM) and on the GEMV path (chunks of 16 with
// DCF_SIM_GEMV=1, as decode steps run on a GPU: 7-8 minutes per case on the emulator, so only
// with DCF_QUANT_GEMV_AGREEMENT=1; docs/QUANTIZATION.md has its numbers). The agreement is
// printed for the record. Bounds: the 98% for int8 weight-only; fp8 (3 mantissa bits)
// measures 91% weight-only and 85-88% with fp8 activations on these random-weight models,
// whose nearly flat logits make argmax the hard case, and is held to 88% and 80%: a broken
// path (a scale applied twice or not at all) moves logits by O(1) and agrees at chance.
struct QuantCase {
  WeightQuant weights;
  ActivationQuant activations;
  DType dtype;
  bool gemv;
};

class CudaSimQuantAgreementTest : public ::testing::TestWithParam<QuantCase> {};

TEST_P(CudaSimQuantAgreementTest, AgreesWithReference) {
  const QuantCase& c = GetParam();
  if (c.gemv) {
    const char* on = std::getenv("DCF_QUANT_GEMV_AGREEMENT");
    if (on == nullptr || std::string(on) != "1") {
      GTEST_SKIP() << "the GEMV path's agreement takes minutes on the emulator: "
                      "DCF_QUANT_GEMV_AGREEMENT=1 runs it";
    }
  }
  const bool fp8_x = c.activations == ActivationQuant::kFp8;
  const double min_agreement = c.weights == WeightQuant::kInt8 ? kInt8MinAgreement
                               : fp8_x                          ? 0.80
                                                                : 0.88;
  const double max_error = c.weights == WeightQuant::kInt8 ? kInt8MaxLogitError : fp8_x ? 0.4 : 0.3;
  int agree_all = 0, rows_all = 0;
  double worst_all = 0;
  for (const std::string& name : testing::GoldenCases()) {
    BackendOptions options;
    options.kind = BackendKind::kCudaSim;
    options.dtype = c.dtype;
    options.weight_quant = c.weights;
    options.activation_quant = c.activations;
    if (c.gemv) setenv("DCF_SIM_GEMV", "1", 1);  // read when the backend is created
    Agreement a;
    MeasureAgreement(name, options, &a, c.gemv ? 16 : 32);
    unsetenv("DCF_SIM_GEMV");
    if (HasFatalFailure()) return;
    agree_all += a.agree;
    rows_all += a.rows;
    worst_all = std::max(worst_all, a.worst);
    const std::string line = absl::StrFormat(
        "cuda-sim %s %s%s %s %s: max |logit error| %.4f, argmax agreement %d/%d",
        WeightQuantName(c.weights), c.activations == ActivationQuant::kFp8 ? "x fp8 " : "",
        ComputeDTypeName(c.dtype), c.gemv ? "GEMV" : "library", name, a.worst, a.agree, a.rows);
    std::cout << line << "\n";
    RecordProperty(name + "_argmax_agreement", absl::StrFormat("%d/%d", a.agree, a.rows));
    EXPECT_LT(a.worst, max_error) << line;
  }
  std::cout << absl::StrFormat("cuda-sim %s%s %s %s all golden cases: argmax agreement %d/%d, "
                               "max |logit error| %.4f\n",
                               WeightQuantName(c.weights),
                               c.activations == ActivationQuant::kFp8 ? " x fp8" : "",
                               ComputeDTypeName(c.dtype), c.gemv ? "GEMV" : "library", agree_all,
                               rows_all, worst_all);
  EXPECT_GE(agree_all, min_agreement * rows_all) << agree_all << "/" << rows_all;
}

std::vector<QuantCase> QuantCases() {
  std::vector<QuantCase> cases;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (bool gemv : {true, false}) {
      cases.push_back({WeightQuant::kInt8, ActivationQuant::kFloat32, dtype, gemv});
      cases.push_back({WeightQuant::kFp8, ActivationQuant::kFloat32, dtype, gemv});
    }
    cases.push_back({WeightQuant::kFp8, ActivationQuant::kFp8, dtype, false});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaSimQuantAgreementTest, ::testing::ValuesIn(QuantCases()),
                         [](const auto& info) {
                           const QuantCase& c = info.param;
                           return std::string(WeightQuantName(c.weights)) +
                                  (c.activations == ActivationQuant::kFp8 ? "_x_fp8" : "") + "_" +
                                  ComputeDTypeName(c.dtype) + (c.gemv ? "_gemv" : "_library");
                         });

}  // namespace
}  // namespace dcf
