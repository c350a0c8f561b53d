// Engine tests on the small golden models (CPU; some also on cuda-sim, the CUDA backend's
// kernels on the SIMT emulator, in float32), one binary (backends_engine_test) of several
// files, helpers in engine_test_util.h. The reference for every greedy output is
// SequenceRunner::Greedy on the same backend: one request, alone. They live with the backends'
// tests because they name concrete backends, which serving never does (tests/unit/serving
// runs on fakes).
//
// This file: continuous batching, chunked prefill, step budgets and preemption keep every
// output equal to its solo run (greedy, golden logprobs, int8 weights, penalised seeded
// sampling against a host replay), and window layers keep their blocks bounded.
#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/sampling/token_sampler.h"
#include "engine/serving/engine.h"
#include "engine/serving/sequence_runner.h"
#include "gtest/gtest.h"
#include "tests/testing/forwarding_backend.h"
#include "tests/testing/golden.h"
#include "tests/unit/backends/engine_test_util.h"

namespace dcf::engine_test {
namespace {

const std::vector<Case> kCases = {{5, 40},   {17, 30}, {40, 60}, {90, 20},
                                  {130, 50}, {33, 45}, {1, 25}};

// Runs kCases with staggered arrivals: the first three, then (after the first token of the
// first one) the rest. Compares every output with its solo reference.
void RunBatchingInvariance(const EngineOptions& options, const std::vector<Case>& kCases,
                           BackendKind kind, int64_t* preemptions, Int8Matrices int8 = {}) {
  auto engine = MakeEngine(options, nullptr, kind, int8);
  std::vector<RequestHandle> handles;
  std::vector<Collected> got(kCases.size());
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < kCases.size(); ++i)
    prompts.push_back(RandomPrompt(kCases[i].len, 100 + i));
  for (size_t i = 0; i < kCases.size(); ++i) {
    if (i == 3) got[0].TakeOne(handles[0].stream());  // later arrivals
    auto h = engine->Enqueue(Greedy(prompts[i], kCases[i].max_new));
    ASSERT_TRUE(h.ok()) << h.status();
    handles.push_back(std::move(*h));
  }
  for (size_t i = 0; i < kCases.size(); ++i) {
    got[i].Drain(handles[i].stream());
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    EXPECT_EQ(got[i].final_chunk.finish_reason, FinishReason::kLength);
    EXPECT_EQ(got[i].ids(), Reference(prompts[i], kCases[i].max_new, kind, int8))
        << "request " << i;
    EXPECT_EQ(got[i].final_chunk.usage.generated_tokens, kCases[i].max_new);
    EXPECT_EQ(got[i].final_chunk.usage.prompt_tokens, kCases[i].len);
  }
  const EngineStats st = engine->Stats();
  EXPECT_EQ(st.kv_blocks_used[0], 0);
  EXPECT_EQ(st.kv_blocks_used[1], 0);
  EXPECT_EQ(st.num_running, 0);
  EXPECT_EQ(st.num_waiting, 0);
  if (st.pipelining) {
    EXPECT_GT(st.chained_steps, 0);
  }
  *preemptions = st.num_preemptions;
}

class BatchingInvarianceTest : public ::testing::TestWithParam<int> {};

TEST_P(BatchingInvarianceTest, LargePoolMatchesSoloRuns) {
  EngineOptions o;
  o.max_prefill_chunk_tokens = GetParam();
  o.max_num_batched_tokens = std::max(GetParam(), 8);
  o.max_num_seqs = 8;
  o.kv_num_blocks = {128, 64};
  int64_t preemptions = -1;
  RunBatchingInvariance(o, kCases, BackendKind::kCpu, &preemptions);
  EXPECT_EQ(preemptions, 0);
}

TEST_P(BatchingInvarianceTest, TinyPoolForcesPreemptionAndStillMatches) {
  EngineOptions o;
  o.max_prefill_chunk_tokens = GetParam();
  o.max_num_batched_tokens = std::max(GetParam(), 8);
  o.max_num_seqs = 8;
  o.watermark = 0;
  o.kv_num_blocks = {12, 6};  // the largest request needs 10 global blocks alone
  int64_t preemptions = -1;
  RunBatchingInvariance(o, kGrowingCases, BackendKind::kCpu, &preemptions);
  EXPECT_GT(preemptions, 0);
}

INSTANTIATE_TEST_SUITE_P(ChunkBudgets, BatchingInvarianceTest, ::testing::Values(1, 7, 64));

// Pipelined steps (EngineOptions::pipeline_steps on; auto leaves them off on the CPU) keep
// every output equal to its solo run through chunked prefill, staggered arrivals and
// preemption of sequences whose last token a step in flight is still sampling.
TEST(EngineTest, PipelinedTinyPoolForcesPreemptionAndStillMatches) {
  EngineOptions o;
  o.max_prefill_chunk_tokens = 7;
  o.max_num_batched_tokens = 8;
  o.max_num_seqs = 8;
  o.watermark = 0;
  o.kv_num_blocks = {12, 6};
  o.pipeline_steps = PipelineSteps::kOn;
  int64_t preemptions = -1;
  RunBatchingInvariance(o, kGrowingCases, BackendKind::kCpu, &preemptions);
  EXPECT_GT(preemptions, 0);
}

// int8 matrices (--weight-dtype int8), weight-only and int8 x int8 (--activation-dtype int8),
// keep batch invariance: continuous batching, chunked prefill and preemption give every
// request its solo run's tokens on the same quantized weights.
TEST(EngineTest, Int8WeightsBatchingWithPreemptionMatchesSoloRuns) {
  for (const Int8Matrices int8 :
       {Int8Matrices{32, false}, Int8Matrices{128, false}, Int8Matrices{64, true}}) {
    EngineOptions o;
    o.max_prefill_chunk_tokens = 7;
    o.max_num_batched_tokens = 8;
    o.max_num_seqs = 8;
    o.watermark = 0;
    o.kv_num_blocks = {12, 6};
    int64_t preemptions = -1;
    RunBatchingInvariance(o, kGrowingCases, BackendKind::kCpu, &preemptions, int8);
    EXPECT_GT(preemptions, 0) << "group " << int8.group << " activations " << int8.activations;
  }
}

#if DCF_ENGINE_TEST_CUDA_SIM
// The same on cuda-sim, shorter (its kernels are emulated): continuous batching with
// staggered arrivals, chunked prefill and preemption, every output equal to its solo run.
TEST(EngineTest, CudaSimBatchingWithPreemptionMatchesSoloRuns) {
  EngineOptions o;
  o.max_prefill_chunk_tokens = 7;
  o.max_num_batched_tokens = 8;
  o.max_num_seqs = 8;
  o.watermark = 0;
  o.kv_num_blocks = {6, 6};  // 16-token blocks: the three first requests outgrow 6 together
  const std::vector<Case> cases = {{5, 70}, {6, 60}, {7, 50}, {30, 20}, {1, 15}};
  int64_t preemptions = -1;
  RunBatchingInvariance(o, cases, BackendKind::kCudaSim, &preemptions);
  EXPECT_GT(preemptions, 0);
}
#endif  // DCF_ENGINE_TEST_CUDA_SIM

TEST(EngineTest, OneNewTokenAndOneTokenPrompt) {
  EngineOptions o;
  o.kv_num_blocks = {64, 32};
  auto engine = MakeEngine(o);
  const auto p = RandomPrompt(1, 77);
  const Collected c = RunToEnd(*engine, Greedy(p, 1));
  EXPECT_EQ(c.ids(), Reference(p, 1));
  EXPECT_EQ(c.final_chunk.finish_reason, FinishReason::kLength);
  EXPECT_GE(c.final_chunk.timing.total, c.final_chunk.timing.time_to_first_token);
}

TEST(EngineTest, StepBudgetOfOneTokenStillMatches) {
  EngineOptions o;
  o.max_num_batched_tokens = 1;  // one sequence runs at a time, one token per step
  o.kv_num_blocks = {64, 32};
  auto engine = MakeEngine(o);
  const auto p0 = RandomPrompt(9, 1), p1 = RandomPrompt(20, 2);
  auto h0 = engine->Enqueue(Greedy(p0, 12));
  auto h1 = engine->Enqueue(Greedy(p1, 12));
  ASSERT_TRUE(h0.ok() && h1.ok());
  Collected c0, c1;
  c0.Drain(h0->stream());
  c1.Drain(h1->stream());
  EXPECT_EQ(c0.ids(), Reference(p0, 12));
  EXPECT_EQ(c1.ids(), Reference(p1, 12));
}

TEST(EngineTest, MatchesGoldenGreedyAndLogprobs) {
  const testing::Golden g = testing::LoadGolden(kModel);
  EngineOptions o;
  o.kv_num_blocks = {64, 32};
  auto engine = MakeEngine(o);
  GenerationRequest r = Greedy(g.prompt, static_cast<int>(g.greedy.size()));
  r.output.logprobs = true;
  r.output.top_logprobs = 3;
  const Collected c = RunToEnd(*engine, r);
  EXPECT_EQ(c.ids(), g.greedy);
  ASSERT_EQ(c.tokens.size(), g.greedy_logprobs.size());
  for (size_t i = 0; i < c.tokens.size(); ++i) {
    EXPECT_NEAR(c.tokens[i].logprob, g.greedy_logprobs[i], 1e-4) << i;
    ASSERT_EQ(c.tokens[i].top.size(), 3u);
    EXPECT_EQ(c.tokens[i].top[0].token, c.tokens[i].token);  // greedy = most likely
    EXPECT_GE(c.tokens[i].top[0].logprob, c.tokens[i].top[1].logprob);
  }
}

TEST(EngineTest, WindowBlocksStayBoundedDuringLongGeneration) {
  EngineOptions o;
  o.kv_num_blocks = {64, 32};
  o.max_prefill_chunk_tokens = 7;
  auto engine = MakeEngine(o);
  absl::Mutex mu;
  int checks = 0;
  std::vector<std::string> violations;
  engine->SetStepHookForTesting([&](const KvCacheManager& kv,
                                    const std::vector<const Sequence*>& running) {
    absl::MutexLock lock(&mu);
    int used_w = 0, used_g = 0;
    for (const Sequence* s : running) {
      ++checks;
      const int held_w = s->kv.HeldBlocks(LayerGroup::kWindow);
      if (held_w > kv.WindowBlockBound()) {
        violations.push_back(absl::StrCat("seq ", s->seq_id, " holds ", held_w,
                                          " window blocks at ", s->kv.num_tokens, " tokens"));
      }
      used_w += held_w;
      used_g += s->kv.HeldBlocks(LayerGroup::kGlobal);
    }
    if (used_w != kv.num_used(LayerGroup::kWindow) || used_g != kv.num_used(LayerGroup::kGlobal)) {
      violations.push_back("pool usage differs from the sum of the block tables");
    }
  });
  const int W = engine->config().window_size;
  ASSERT_GT(W, 0);
  const auto p0 = RandomPrompt(10, 5), p1 = RandomPrompt(40, 6);
  auto h0 = engine->Enqueue(Greedy(p0, 10 * W + 20));  // > 10x the window
  auto h1 = engine->Enqueue(Greedy(p1, 100));
  ASSERT_TRUE(h0.ok() && h1.ok());
  Collected c0, c1;
  c0.Drain(h0->stream());
  c1.Drain(h1->stream());
  EXPECT_EQ(c0.ids(), Reference(p0, 10 * W + 20));
  EXPECT_EQ(c1.ids(), Reference(p1, 100));
  absl::MutexLock lock(&mu);
  EXPECT_GT(checks, 10 * W);
  EXPECT_TRUE(violations.empty()) << violations.front();
  EXPECT_EQ(engine->Stats().kv_blocks_used[0], 0);
  EXPECT_EQ(engine->Stats().kv_blocks_used[1], 0);
}

// The engine's sampled tokens (penalties, seed, top-k) equal a host replay of the same
// request: the CPU backend's logits for the sequence alone, drawn by the reference sampler
// with the request's seed and its draw counter, even when the request is preempted and
// recomputed in a crowded pool.
// The backend's sampler (host code on the CPU, the device sampler on cuda-sim) with
// penalties whose state is re-uploaded after every preemption, against the host sampler
// replaying the same sequence on the same backend's logits.
TEST_P(EngineBackendTest, PenalisedSeededSamplingMatchesHostReplayThroughPreemption) {
  GenerationRequest r;
  r.prompt_tokens = RandomPrompt(6, 77);
  r.sampling.temperature = 0.8f;
  r.sampling.top_k = 50;
  r.sampling.repetition_penalty = 1.4f;
  r.sampling.presence_penalty = 0.3f;
  r.sampling.frequency_penalty = 0.2f;
  r.sampling.seed = 1234;
  r.stopping.max_new_tokens = GetParam() == BackendKind::kCpu ? 120 : 60;  // emulated: shorter
  r.output.text = false;

  // Host replay.
  std::vector<int32_t> want;
  {
    auto backend = LoadBackend(GetParam());
    auto runner = SequenceRunner::Create(backend.get());
    ASSERT_TRUE(runner.ok());
    const int V = backend->config().vocab_size;
    PenaltyState penalties(V);
    penalties.Reset(r.prompt_tokens, {});
    SamplerScratch scratch;
    std::vector<float> logits;
    ASSERT_TRUE((*runner)->Append(r.prompt_tokens, 16, &logits).ok());
    for (int i = 0; i < r.stopping.max_new_tokens; ++i) {
      const auto last = absl::MakeConstSpan(logits).subspan(logits.size() - V, V);
      const int32_t t = SampleToken(last, r.sampling, *r.sampling.seed, i, &penalties, &scratch);
      penalties.Record(t);
      want.push_back(t);
      logits.clear();
      ASSERT_TRUE((*runner)->Append({t}, 1, &logits).ok());
    }
  }

  EngineOptions o;
  o.max_num_seqs = 8;
  o.watermark = 0;
  o.kv_num_blocks = {12, 6};  // too small for the crowd: forces preemption
  auto engine = MakeEngine(o, nullptr, GetParam());
  std::vector<RequestHandle> crowd;
  for (int i = 0; i < 3; ++i) {
    GenerationRequest other = r;
    other.prompt_tokens = RandomPrompt(5 + i, 200 + i);
    other.sampling.seed = 7 + i;
    auto h = engine->Enqueue(other);
    ASSERT_TRUE(h.ok());
    crowd.push_back(std::move(*h));
  }
  auto h = engine->Enqueue(r);
  ASSERT_TRUE(h.ok());
  Collected got;
  got.Drain(h->stream());
  for (auto& c : crowd) {
    Collected x;
    x.Drain(c.stream());
  }
  EXPECT_EQ(got.ids(), want);
  EXPECT_GT(engine->Stats().num_preemptions, 0);
}

// Counts the uploads of penalty state (SetPenaltyState calls).
class PenaltyUploadCounter : public testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  absl::Status SetPenaltyState(int slot, absl::Span<const int32_t> prompt,
                               absl::Span<const int32_t> generated) override {
    uploads.fetch_add(1);
    return ForwardingBackend::SetPenaltyState(slot, prompt, generated);
  }
  std::atomic<int64_t> uploads{0};
};

// A pipelined step that preempts and plans no chunk: A (older) and B decode in lockstep on
// a 4-block pool; when A's last token is being sampled by the step in flight (nothing left
// to compute for A) B needs its third block, which A's two still hold, so B preempts itself
// and the step plans nothing. B must give back its penalty slot then (before 2026-12-07 it
// kept it, and its readmission uploaded no penalty state): each admission, the first and the
// one after the preemption, uploads, and both outputs equal their runs alone.
TEST(EngineTest, PipelinedSelfPreemptionWithNoChunkUploadsPenaltiesAgain) {
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 2; ++i) {
    GenerationRequest r;
    r.prompt_tokens = RandomPrompt(5 + i, 300 + i);
    r.sampling.temperature = 0.8f;
    r.sampling.repetition_penalty = 1.3f;
    r.sampling.frequency_penalty = 0.2f;
    r.sampling.seed = 11 + i;
    r.stopping.max_new_tokens = i == 0 ? 27 : 40;  // A ends at 32 tokens (two blocks)
    r.stopping.ignore_eos = true;
    r.output.text = false;
    requests.push_back(r);
  }
  std::vector<std::vector<int32_t>> want;  // alone, on a pool that holds it
  {
    EngineOptions solo;
    solo.kv_num_blocks = {64, 16};
    auto engine = MakeEngine(solo);
    for (const GenerationRequest& r : requests) {
      auto h = engine->Enqueue(r);
      ASSERT_TRUE(h.ok()) << h.status();
      Collected got;
      got.Drain(h->stream());
      want.push_back(got.ids());
    }
  }
  EngineOptions o;
  o.watermark = 0;
  o.kv_num_blocks = {4, 8};
  o.pipeline_steps = PipelineSteps::kOn;
  auto counter = std::make_unique<PenaltyUploadCounter>(LoadBackend());
  PenaltyUploadCounter* const uploads = counter.get();
  auto engine = Engine::Create(std::move(counter), nullptr, o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto handles = (*engine)->EnqueueAll(requests);
  ASSERT_TRUE(handles.ok()) << handles.status();
  for (size_t i = 0; i < handles->size(); ++i) {
    Collected got;
    got.Drain((*handles)[i].stream());
    EXPECT_EQ(got.ids(), want[i]) << "request " << i;
  }
  const EngineStats st = (*engine)->Stats();
  EXPECT_TRUE(st.pipelining);
  EXPECT_EQ(st.num_preemptions, 1);
  EXPECT_EQ(uploads->uploads.load(), 2 + st.num_preemptions);
}

}  // namespace
}  // namespace dcf::engine_test
