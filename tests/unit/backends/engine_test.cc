// Engine tests on the small golden models (CPU; the batching, preemption, penalised sampling
// and failure tests also on cuda-sim, the CUDA backend's kernels on the SIMT emulator, in
// float32). The reference for every greedy output is SequenceRunner::Greedy on the same
// backend: one request, alone. They live with the backends' tests because they name concrete
// backends, which serving never does (tests/unit/serving runs on fakes).
#include "engine/serving/engine.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "engine/common/logging.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cuda/cuda_backend_factory.h"
#include "engine/execution/backend_options.h"
#include "engine/model/model_weights.h"
#include "engine/sampling/token_sampler.h"
#include "engine/serving/sequence_runner.h"
#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/weights/checkpoint.h"
#include "gtest/gtest.h"
#include "tests/testing/collected_stream.h"
#include "tests/testing/forwarding_backend.h"
#include "tests/testing/golden.h"
#include "tests/testing/tiny_tokenizer.h"
// The emulator's test hooks (inject a sticky device fault); plain C++, no toolkit.
#include "engine/simt/simt_testing.h"

namespace dcf {
namespace {

const char kModel[] = "dcformer-f32-long-prompt";

// The golden model in float32 on the CPU backend or on cuda-sim, built directly (the backend
// factory sits above the engine). `corrupt`: every 7th entry of layer 1's wo is NaN.
// `int8`: the cpu backend's matrices (cpu only; engine/weights/int8_quant.h).
std::unique_ptr<Backend> LoadBackend(BackendKind kind = BackendKind::kCpu, bool corrupt = false,
                                     Int8Matrices int8 = {}) {
  const std::string dir = testing::GoldenDir(kModel);
  auto config = ModelConfig::FromFile(dir + "/config.json");
  DCF_CHECK(config.ok()) << config.status();
  auto reader = OpenCheckpointDir(dir);
  DCF_CHECK(reader.ok()) << reader.status();
  auto weights = LoadModelWeights(*config, **reader);  // float32
  DCF_CHECK(weights.ok()) << weights.status();
  if (corrupt) {
    Tensor& wo = weights->layers[1].wo_w;
    for (int64_t k = 6; k < wo.numel(); k += 7) wo.f32()[k] = std::nanf("");
  }
  DCF_CHECK(kind == BackendKind::kCpu || kind == BackendKind::kCudaSim) << BackendKindName(kind);
  absl::StatusOr<std::unique_ptr<Backend>> backend;
  if (kind == BackendKind::kCpu) {
    CpuBackendOptions options;
    options.int8 = int8;
    auto cpu = CpuBackend::Create(*config, *std::move(weights), options);
    backend = cpu.ok() ? absl::StatusOr<std::unique_ptr<Backend>>(*std::move(cpu)) : cpu.status();
  } else {
    BackendOptions o;
    o.dtype = DType::kF32;
    backend = cuda::sim::CreateBackend(*config, *std::move(weights), o);
  }
  DCF_CHECK(backend.ok()) << backend.status();
  return *std::move(backend);
}

std::string KindName(BackendKind k) {
  std::string n = BackendKindName(k);
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

std::vector<int32_t> RandomPrompt(int len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(static_cast<int32_t>(3 + rng() % 290));
  return p;
}

// A map key for Int8Matrices.
std::pair<int, bool> Key(Int8Matrices int8) { return {int8.group, int8.activations}; }

// Greedy reference, cached: one sequence alone on a backend of `kind`, prompt fed in chunks
// of 16.
std::vector<int32_t> Reference(const std::vector<int32_t>& prompt, int max_new,
                               BackendKind kind = BackendKind::kCpu, Int8Matrices int8 = {}) {
  static auto* backends =
      new std::map<std::pair<BackendKind, std::pair<int, bool>>, std::unique_ptr<Backend>>();
  static auto* cache =
      new std::map<std::tuple<std::vector<int32_t>, int, BackendKind, std::pair<int, bool>>,
                   std::vector<int32_t>>();
  auto key = std::make_tuple(prompt, max_new, kind, Key(int8));
  auto it = cache->find(key);
  if (it != cache->end()) return it->second;
  std::unique_ptr<Backend>& backend = (*backends)[{kind, Key(int8)}];
  if (backend == nullptr) backend = LoadBackend(kind, false, int8);
  auto runner = SequenceRunner::Create(backend.get());
  DCF_CHECK(runner.ok()) << runner.status();
  auto r = (*runner)->Greedy(prompt, max_new, 16);
  DCF_CHECK(r.ok()) << r.status();
  (*cache)[key] = r->tokens;
  return r->tokens;
}

GenerationRequest Greedy(const std::vector<int32_t>& prompt, int max_new) {
  GenerationRequest r;
  r.prompt_tokens = prompt;
  r.sampling.temperature = 0;
  r.stopping.max_new_tokens = max_new;
  r.output.text = false;
  return r;
}

using testing::Collected;
using testing::RunToEnd;

std::unique_ptr<Engine> MakeEngine(EngineOptions options, const Tokenizer* tok = nullptr,
                                   BackendKind kind = BackendKind::kCpu, Int8Matrices int8 = {}) {
  auto e = Engine::Create(LoadBackend(kind, false, int8), tok, options);
  DCF_CHECK(e.ok()) << e.status();
  return std::move(*e);
}

struct Case {
  int len, max_new;
};
const std::vector<Case> kCases = {{5, 40}, {17, 30}, {40, 60}, {90, 20}, {130, 50}, {33, 45}, {1, 25}};
// Short prompts with long generations: the first three alone outgrow a 12-block pool.
const std::vector<Case> kGrowingCases = {{5, 150}, {6, 140}, {7, 130}, {40, 60}, {90, 20}, {1, 25}};

// Runs kCases with staggered arrivals: the first three, then (after the first token of the
// first one) the rest. Compares every output with its solo reference.
void RunBatchingInvariance(const EngineOptions& options, const std::vector<Case>& kCases,
                           BackendKind kind, int64_t* preemptions, Int8Matrices int8 = {}) {
  auto engine = MakeEngine(options, nullptr, kind, int8);
  std::vector<RequestHandle> handles;
  std::vector<Collected> got(kCases.size());
  std::vector<std::vector<int32_t>> prompts;
  for (size_t i = 0; i < kCases.size(); ++i) prompts.push_back(RandomPrompt(kCases[i].len, 100 + i));
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
  if (st.pipelining) EXPECT_GT(st.chained_steps, 0);
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
  for (const Int8Matrices int8 : {Int8Matrices{32, false}, Int8Matrices{128, false},
                                  Int8Matrices{64, true}}) {
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

// Counts the observer hooks (called on the loop thread; read after the engine is idle).
class CountingObserver : public EngineObserver {
 public:
  void OnStep(int num_seqs, int num_tokens, int num_prefill_tokens,
              absl::Duration step_time) override {
    absl::MutexLock l(&mu);
    ++steps;
    step_times += step_time;
    tokens += num_tokens;
    prefill_tokens += num_prefill_tokens;
    max_seqs = std::max(max_seqs, num_seqs);
  }
  void OnPreemption() override {
    absl::MutexLock l(&mu);
    ++preemptions;
  }
  void OnFirstToken(int, absl::Duration) override {
    absl::MutexLock l(&mu);
    ++first_tokens;
  }
  void OnInterTokenLatency(int, absl::Duration) override {
    absl::MutexLock l(&mu);
    ++later_tokens;
  }
  void OnNonFiniteLogits() override {
    absl::MutexLock l(&mu);
    ++nonfinite;
  }
  void OnFinished(int, const GenerationChunk& c) override {
    absl::MutexLock l(&mu);
    ++finished;
    generated += c.usage.generated_tokens;
  }
  absl::Mutex mu;
  int64_t steps = 0, tokens = 0, prefill_tokens = 0, preemptions = 0, first_tokens = 0,
          later_tokens = 0, finished = 0, generated = 0, nonfinite = 0;
  int max_seqs = 0;
  absl::Duration step_times;  // summed
};

TEST(EngineTest, ObserverAndStatsAgree) {
  CountingObserver obs;
  EngineOptions o;
  o.kv_num_blocks = {12, 6};
  o.watermark = 0;
  auto created = Engine::Create(LoadBackend(), nullptr, o, &obs);
  ASSERT_TRUE(created.ok()) << created.status();
  auto engine = std::move(*created);
  std::vector<RequestHandle> handles;
  int64_t want_generated = 0;
  for (size_t i = 0; i < kGrowingCases.size(); ++i) {
    auto h = engine->Enqueue(Greedy(RandomPrompt(kGrowingCases[i].len, 300 + i),
                                    kGrowingCases[i].max_new));
    ASSERT_TRUE(h.ok()) << h.status();
    want_generated += kGrowingCases[i].max_new;
    handles.push_back(std::move(*h));
  }
  for (auto& h : handles) {
    Collected c;
    c.Drain(h.stream());
  }
  const EngineStats st = engine->Stats();
  absl::MutexLock l(&obs.mu);
  EXPECT_EQ(obs.finished, static_cast<int64_t>(kGrowingCases.size()));
  EXPECT_EQ(obs.generated, want_generated);
  EXPECT_EQ(obs.first_tokens + obs.later_tokens, want_generated);
  EXPECT_EQ(st.tokens_generated, want_generated);
  EXPECT_EQ(obs.steps, st.steps);
  EXPECT_GT(obs.preemptions, 0);
  EXPECT_EQ(obs.preemptions, st.num_preemptions);
  EXPECT_EQ(obs.prefill_tokens, st.prompt_tokens_computed);
  EXPECT_GT(obs.max_seqs, 1);
  EXPECT_TRUE(st.loop_alive);
  EXPECT_EQ(st.kv_blocks_total[0], 12);
  EXPECT_EQ(st.kv_blocks_used[0], 0);
}

// The engine resolves every limit once; the server and the tools read them (GetModelInfo).
TEST(EngineTest, LimitsAreResolvedFromTheOptionsTheModelAndTheTokenizer) {
  EngineOptions o;
  o.kv_num_blocks = {64, 32};
  o.max_prompt_tokens = 100000;  // beyond the context: the context bounds it
  o.max_new_tokens_limit = 40;
  o.default_max_new_tokens = 7;
  auto engine = MakeEngine(o);
  const RequestLimits& l = engine->limits();
  EXPECT_EQ(l.vocab_size, 300);
  EXPECT_EQ(l.context, 256);
  EXPECT_EQ(l.max_prompt_tokens, 256);
  EXPECT_EQ(l.max_new_tokens_limit, 40);
  EXPECT_EQ(l.default_max_new_tokens, 7);
  EXPECT_EQ(l.DefaultMaxNewTokens(10), 7);
  EXPECT_EQ(l.DefaultMaxNewTokens(252), 4);   // the context left after the prompt
  EXPECT_EQ(l.DefaultMaxNewTokens(256), 1);   // never below 1 (the validator rejects it)
  // No tokenizer: no EOS, although config.json names one (generation never stops at it).
  ASSERT_EQ(engine->config().eos_token_id, std::optional<int>(2));
  EXPECT_FALSE(l.eos_token_id.has_value());
  EXPECT_EQ(l.tokenizer, nullptr);
  const auto tok = testing::TinyTokenizer();
  auto with_tokenizer = MakeEngine(o, tok.get());
  EXPECT_EQ(with_tokenizer->limits().eos_token_id, std::optional<int32_t>(299));
  EXPECT_EQ(with_tokenizer->limits().tokenizer, tok.get());
  // The one resolution, which dcformer-generate uses too (review finding 10).
  const RequestLimits r = ResolveRequestLimits(300, 256, 100000, 40, 7, tok.get());
  EXPECT_EQ(r.max_prompt_tokens, 256);
  EXPECT_EQ(r.max_new_tokens_limit, 40);
  EXPECT_EQ(r.default_max_new_tokens, 7);
  EXPECT_EQ(r.eos_token_id, std::optional<int32_t>(299));
  EXPECT_EQ(ResolveRequestLimits(300, 256, 0, 0, 7, nullptr).max_new_tokens_limit, 256);
}

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

// Both requests are cancelled at a known point (the step hook holds the loop after the
// running one's 5th token until both cancels are in): the running one ends with exactly those
// 5 tokens, the greedy reference's first 5; the queued one with none; every block is free.
TEST(EngineTest, CancelRunningAndQueuedFreesBlocks) {
  absl::Notification at_five, cancelled;  // outlive the engine, whose loop runs the hook
  EngineOptions o;
  o.max_num_seqs = 1;
  o.kv_num_blocks = {64, 32};
  auto engine = MakeEngine(o);
  engine->SetStepHookForTesting(
      [&](const KvCacheManager&, const std::vector<const Sequence*>& running) {
        for (const Sequence* s : running) {
          if (s->num_generated() == 5 && !at_five.HasBeenNotified()) {
            at_five.Notify();
            cancelled.WaitForNotification();
          }
        }
      });
  const std::vector<int32_t> prompt = RandomPrompt(20, 7);
  auto running = engine->Enqueue(Greedy(prompt, 200));
  auto queued = engine->Enqueue(Greedy(RandomPrompt(20, 8), 200));
  ASSERT_TRUE(running.ok() && queued.ok());
  at_five.WaitForNotification();  // `running` has 5 tokens; `queued` waits (max_num_seqs 1)
  queued->Cancel();
  engine->Cancel(running->stream().key());
  cancelled.Notify();  // the loop takes both cancels before its next step
  Collected c_run, c_q;
  c_q.Drain(queued->stream());
  c_run.Drain(running->stream());
  EXPECT_EQ(c_q.final_chunk.finish_reason, FinishReason::kCancelled);
  EXPECT_TRUE(c_q.tokens.empty());
  EXPECT_EQ(c_q.final_chunk.usage.generated_tokens, 0);
  EXPECT_EQ(c_run.final_chunk.finish_reason, FinishReason::kCancelled);
  const std::vector<int32_t> reference = Reference(prompt, 200);
  EXPECT_EQ(c_run.ids(), std::vector<int32_t>(reference.begin(), reference.begin() + 5));
  EXPECT_EQ(c_run.final_chunk.usage.generated_tokens, 5);
  EXPECT_EQ(c_run.final_chunk.usage.prompt_tokens, 20);
  const EngineStats st = engine->Stats();  // the final chunk is pushed after the stats
  EXPECT_EQ(st.kv_blocks_used[0], 0);
  EXPECT_EQ(st.kv_blocks_used[1], 0);
  EXPECT_EQ(st.num_running, 0);
  EXPECT_EQ(st.num_waiting, 0);
}

TEST(EngineTest, DroppingTheHandleCancels) {
  EngineOptions o;
  o.kv_num_blocks = {64, 32};
  auto engine = MakeEngine(o);
  std::shared_ptr<RequestStream> stream;
  {
    auto h = engine->Enqueue(Greedy(RandomPrompt(20, 9), 200));
    ASSERT_TRUE(h.ok());
    stream = h->shared_stream();
  }
  Collected c;
  c.Drain(*stream);
  EXPECT_EQ(c.final_chunk.finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(engine->Stats().kv_blocks_used[0], 0);
}

// A handle may outlive its engine: cancelling or dropping it afterwards does nothing (under
// ASan a handle that still pointed at the engine would be a use-after-free here).
TEST(EngineTest, HandleOutlivingTheEngineIsHarmless) {
  EngineOptions o;
  o.kv_num_blocks = {64, 32};
  auto engine = MakeEngine(o);
  auto h = engine->Enqueue(Greedy(RandomPrompt(20, 9), 200));
  ASSERT_TRUE(h.ok());
  RequestHandle handle = std::move(*h);
  const std::shared_ptr<RequestStream> stream = handle.shared_stream();
  engine.reset();  // shuts down: the request is cancelled
  ASSERT_FALSE(stream->done());  // final chunk not taken yet: Cancel reaches for the engine
  handle.Cancel();
  handle = RequestHandle();  // move-assigning cancels the old request again: still a no-op
  Collected c;
  c.Drain(*stream);
  EXPECT_EQ(c.final_chunk.finish_reason, FinishReason::kCancelled);
}

TEST(EngineTest, AdmissionControl) {
  EngineOptions o;
  o.max_num_seqs = 1;
  o.max_queued_requests = 2;
  o.max_queued_prompt_tokens = 50;
  o.kv_num_blocks = {8, 8};
  auto engine = MakeEngine(o);
  // Beyond the context (256), and beyond the pool (8 blocks of 16 = 128 tokens).
  EXPECT_EQ(engine->Enqueue(Greedy(RandomPrompt(200, 1), 100)).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(engine->Enqueue(Greedy(RandomPrompt(100, 1), 40)).status().code(),
            absl::StatusCode::kOutOfRange);
  // A prompt longer than the queue's token bound can never be queued, even on an idle engine:
  // OutOfRange (cannot succeed), not ResourceExhausted (retry later). Issue 24.
  const auto never = engine->Enqueue(Greedy(RandomPrompt(51, 1), 10));
  EXPECT_EQ(never.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(never.status().message(),
            "prompt_tokens: 51 tokens exceed the waiting queue's limit of 50 prompt tokens "
            "(max_queued_prompt_tokens): this prompt can never be queued");
  auto running = engine->Enqueue(Greedy(RandomPrompt(10, 1), 100));
  ASSERT_TRUE(running.ok());
  Collected c;
  c.TakeOne(running->stream());  // running: the queue is empty again
  auto waiting = engine->Enqueue(Greedy(RandomPrompt(40, 2), 10));
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  // 40 + 20 prompt tokens would wait: full for now, in prompt tokens.
  auto too_many_tokens = engine->Enqueue(Greedy(RandomPrompt(20, 2), 10));
  EXPECT_EQ(too_many_tokens.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(too_many_tokens.status().message().find("retry later"), absl::string_view::npos);
  auto second = engine->Enqueue(Greedy(RandomPrompt(10, 2), 10));  // 50 tokens: at the bound
  ASSERT_TRUE(second.ok()) << second.status();
  auto full = engine->Enqueue(Greedy(RandomPrompt(1, 3), 10));  // 2 requests wait
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  engine->StopAccepting();
  EXPECT_EQ(engine->Enqueue(Greedy(RandomPrompt(10, 3), 10)).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(EngineTest, InvalidRequestsNameTheField) {
  EngineOptions o;
  o.kv_num_blocks = {64, 32};
  auto engine = MakeEngine(o);
  const auto check = [&](GenerationRequest r, const char* field) {
    const absl::Status st = engine->Enqueue(std::move(r)).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << field << ": " << st;
    EXPECT_NE(st.message().find(field), absl::string_view::npos) << st.message();
  };
  const auto base = Greedy(RandomPrompt(5, 1), 5);
  auto r = base;
  r.prompt_tokens.clear();
  check(r, "prompt_tokens");
  r = base;
  r.prompt_tokens[2] = 300;
  check(r, "prompt_tokens[2]");
  r = base;
  r.sampling.top_p = 0;
  check(r, "top_p");
  r = base;
  r.stopping.max_new_tokens = 0;
  check(r, "max_new_tokens");
  r = base;
  r.output.top_logprobs = 21;
  check(r, "top_logprobs");
  r = base;
  r.output.text = true;
  check(r, "output.text");
  r = base;
  r.stopping.stop_strings = {"x"};
  check(r, "stop_strings");
  // The API's field name, as docs/API.md promises (GenerationRequest calls it `id`).
  r = base;
  r.id = std::string(129, 'x');
  EXPECT_EQ(engine->Enqueue(r).status(),
            absl::InvalidArgumentError("request_id: must be at most 128 bytes, got 129"));
  r.id = "a b";
  EXPECT_EQ(
      engine->Enqueue(r).status(),
      absl::InvalidArgumentError("request_id: must be printable ASCII without spaces (byte 1)"));
  r.id = std::string(128, 'x');
  EXPECT_TRUE(engine->Enqueue(r).ok());
}

TEST(EngineTest, StopTokenAndEosOverride) {
  EngineOptions o;
  o.kv_num_blocks = {64, 32};
  auto engine = MakeEngine(o);
  const auto p = RandomPrompt(12, 11);
  const auto ref = Reference(p, 30);
  const int32_t stop = ref[6];
  const size_t first = std::find(ref.begin(), ref.end(), stop) - ref.begin();
  auto r = Greedy(p, 30);
  r.stopping.stop_token_ids = {stop};
  const Collected c = RunToEnd(*engine, r);
  EXPECT_EQ(c.final_chunk.finish_reason, FinishReason::kStopToken);
  EXPECT_EQ(c.ids(), std::vector<int32_t>(ref.begin(), ref.begin() + first + 1));

  r = Greedy(p, 30);
  r.stopping.eos_token_id = stop;
  const Collected e = RunToEnd(*engine, r);
  EXPECT_EQ(e.final_chunk.finish_reason, FinishReason::kEos);
  EXPECT_EQ(e.ids().size(), first + 1);

  r.stopping.ignore_eos = true;
  const Collected i = RunToEnd(*engine, r);
  EXPECT_EQ(i.final_chunk.finish_reason, FinishReason::kLength);
  EXPECT_EQ(i.ids(), ref);
}

// A seeded request samples the same tokens alone and sharing every step with four other
// sampled requests (the step hook checks that it did share them), and other tokens with
// another seed.
TEST(EngineTest, SeededSamplingIsReproducibleAloneAndBatched) {
  absl::Mutex mu;
  std::vector<int> shared_with;  // per step that ran our request: the sequences in that step
  bool watching = false;
  EngineOptions o;
  o.kv_num_blocks = {128, 64};
  auto engine = MakeEngine(o);
  GenerationRequest r;
  r.prompt_tokens = RandomPrompt(15, 21);
  engine->SetStepHookForTesting(
      [&](const KvCacheManager&, const std::vector<const Sequence*>& running) {
        absl::MutexLock lock(&mu);
        if (!watching) return;
        for (const Sequence* s : running) {
          if (std::equal(r.prompt_tokens.begin(), r.prompt_tokens.end(), s->tokens.begin()) &&
              s->num_generated() <= 30) {
            shared_with.push_back(static_cast<int>(running.size()));
          }
        }
      });
  r.sampling.temperature = 1.0f;
  r.sampling.top_p = 0.95f;
  r.sampling.seed = 42;
  r.stopping.max_new_tokens = 40;
  r.output.text = false;
  auto alone = engine->Enqueue(r);
  ASSERT_TRUE(alone.ok());
  Collected a;
  a.Drain(alone->stream());
  // Same request in a crowd of other sampled requests, arriving in a different order.
  {
    absl::MutexLock lock(&mu);
    watching = true;
  }
  std::vector<RequestHandle> crowd;
  for (int i = 0; i < 4; ++i) {
    GenerationRequest other = r;
    other.prompt_tokens = RandomPrompt(10 + 20 * i, 50 + i);
    other.sampling.seed.reset();
    auto h = engine->Enqueue(other);
    ASSERT_TRUE(h.ok());
    crowd.push_back(std::move(*h));
  }
  auto batched = engine->Enqueue(r);
  ASSERT_TRUE(batched.ok());
  Collected b;
  b.Drain(batched->stream());
  EXPECT_EQ(a.ids(), b.ids());
  {
    absl::MutexLock lock(&mu);
    watching = false;
    // Its first 30 tokens were sampled in steps with all four others (they started first and
    // generate 40 tokens each).
    EXPECT_EQ(shared_with, std::vector<int>(30, 5));
  }
  r.sampling.seed = 43;
  auto other_seed = engine->Enqueue(r);
  ASSERT_TRUE(other_seed.ok());
  Collected c;
  c.Drain(other_seed->stream());
  EXPECT_NE(a.ids(), c.ids());
  for (auto& h : crowd) {
    Collected x;
    x.Drain(h.stream());
  }
}

TEST(EngineTest, StopStringAcrossTokenBoundaries) {
  const auto tok = testing::TinyTokenizer();
  ASSERT_EQ(tok->eos_token_id(), std::optional<int32_t>(299));
  EngineOptions o;
  o.kv_num_blocks = {64, 32};
  auto engine = MakeEngine(o, tok.get());
  EXPECT_EQ(engine->limits().eos_token_id, std::optional<int32_t>(299));
  GenerationRequest r = Greedy(RandomPrompt(8, 31), 80);
  r.output.text = true;
  r.stopping.ignore_eos = true;
  const Collected full = RunToEnd(*engine, r);
  ASSERT_EQ(full.text, *tok->Decode(full.ids(), /*skip_special_tokens=*/true));
  // A stop string made of the last byte of one ASCII token and the next ASCII token.
  const auto ids = full.ids();
  std::string stop;
  size_t k = 3;
  for (; k + 1 < ids.size(); ++k) {
    if (ids[k] >= 32 && ids[k] < 127 && ids[k + 1] >= 32 && ids[k + 1] < 127) {
      stop = std::string{static_cast<char>(ids[k]), static_cast<char>(ids[k + 1])};
      break;
    }
  }
  ASSERT_FALSE(stop.empty()) << "no two printable ASCII tokens in a row";
  const size_t at = full.text.find(stop);
  for (bool include : {false, true}) {
    r.stopping.stop_strings = {stop, "never-matches-this"};
    r.stopping.include_stop_string = include;
    const Collected c = RunToEnd(*engine, r);
    EXPECT_EQ(c.final_chunk.finish_reason, FinishReason::kStopString);
    EXPECT_EQ(c.text, full.text.substr(0, at + (include ? stop.size() : 0)));
    // Tokens up to the one that completed the match were emitted, and none after.
    ASSERT_LE(c.ids().size(), ids.size());
    EXPECT_EQ(c.ids(), std::vector<int32_t>(ids.begin(), ids.begin() + c.ids().size()));
    // The emitted text is a prefix of the emitted tokens' text (the rest was cut at the stop).
    EXPECT_TRUE(absl::StartsWith(*tok->Decode(c.ids(), true), c.text)) << c.text;
  }
  // Stop strings work without text output too (the text is matched, not returned).
  r.stopping.stop_strings = {stop};
  r.stopping.include_stop_string = false;
  r.output.text = false;
  const Collected no_text = RunToEnd(*engine, r);
  EXPECT_EQ(no_text.final_chunk.finish_reason, FinishReason::kStopString);
  EXPECT_TRUE(no_text.text.empty());
  EXPECT_LT(no_text.ids().size(), ids.size());
}

// A model whose vocabulary is larger than its tokenizer's (padded embeddings): ids without
// text stream as tokens with empty text instead of failing the request.
TEST(EngineTest, IdsTheTokenizerCannotDecodeHaveNoText) {
  TokenizerSpec spec;
  for (int b = 0; b < 256; ++b) {
    std::string t;
    AppendByteLevel(std::string(1, static_cast<char>(b)), &t);
    spec.vocab[t] = b;
  }
  auto tok = Tokenizer::FromSpec(std::move(spec));  // ids 256..299 of the model have no token
  ASSERT_TRUE(tok.ok());
  EngineOptions o;
  o.kv_num_blocks = {64, 32};
  auto engine = MakeEngine(o, tok->get());
  GenerationRequest r = Greedy(RandomPrompt(8, 31), 80);
  r.output.text = true;
  const Collected c = RunToEnd(*engine, r);
  EXPECT_EQ(c.final_chunk.finish_reason, FinishReason::kLength) << c.final_chunk.error;
  const std::vector<int32_t> ids = c.ids();
  ASSERT_TRUE(std::any_of(ids.begin(), ids.end(), [](int32_t t) { return t >= 256; }))
      << "the greedy output never used an id beyond the tokenizer; pick another prompt";
  std::vector<int32_t> decodable;
  for (int32_t t : ids) {
    if (t < 256) decodable.push_back(t);
  }
  EXPECT_EQ(c.text, *(*tok)->Decode(decodable));
}

// Client ids are only labels: two live requests may share one, and cancelling one (by its
// stream's key) never touches the other.
TEST(EngineTest, DuplicateClientIdsAreIndependent) {
  EngineOptions o;
  o.kv_num_blocks = {64, 32};
  auto engine = MakeEngine(o);
  GenerationRequest a = Greedy(RandomPrompt(10, 41), 150);
  a.id = "same-id";
  GenerationRequest b = Greedy(RandomPrompt(12, 42), 30);
  b.id = "same-id";
  auto ha = engine->Enqueue(a);
  auto hb = engine->Enqueue(b);
  ASSERT_TRUE(ha.ok() && hb.ok()) << ha.status() << hb.status();
  EXPECT_NE(ha->stream().key(), hb->stream().key());
  EXPECT_EQ(hb->stream().id(), "same-id");
  Collected ca, cb;
  ca.TakeOne(ha->stream());
  ha->Cancel();
  ca.Drain(ha->stream());
  cb.Drain(hb->stream());
  EXPECT_EQ(ca.final_chunk.finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(cb.final_chunk.finish_reason, FinishReason::kLength);
  EXPECT_EQ(cb.ids(), Reference(b.prompt_tokens, 30));
  // A late cancel of a finished request's key is ignored: it cannot hit a newer request.
  auto hc = engine->Enqueue(b);
  ASSERT_TRUE(hc.ok());
  engine->Cancel(hb->stream().key());
  Collected cc;
  cc.Drain(hc->stream());
  EXPECT_EQ(cc.final_chunk.finish_reason, FinishReason::kLength);
}

// The engine's sampled tokens (penalties, seed, top-k) equal a host replay of the same
// request: the CPU backend's logits for the sequence alone, drawn by the reference sampler
// with the request's seed and its draw counter, even when the request is preempted and
// recomputed in a crowded pool.
class EngineBackendTest : public ::testing::TestWithParam<BackendKind> {};

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

// A backend whose step `fail_at` (0-based) fails like a sticky device fault.
class FailingBackend : public testing::ForwardingBackend {
 public:
  FailingBackend(std::unique_ptr<Backend> inner, int fail_at)
      : ForwardingBackend(std::move(inner)), fail_at_(fail_at) {}
  absl::Status Launch(const StepBatch& b) override {
    if (steps_++ == fail_at_) return absl::InternalError("injected device fault");
    return ForwardingBackend::Launch(b);
  }

 private:
  int fail_at_;
  int steps_ = 0;
};

// Non-finite logits end only the request they belong to: the others in the same steps go on
// and produce what they produce alone.
class PoisonedPrefill : public testing::ForwardingBackend {
 public:
  static constexpr int32_t kPoison = 1;  // RandomPrompt never starts with it
  using ForwardingBackend::ForwardingBackend;
  absl::Status Launch(const StepBatch& b) override {
    poisoned_.clear();
    for (int s = 0; s < b.num_seqs(); ++s) {
      if (b.sample[s] && b.start_pos(s) == 0 && b.tokens[b.seq_offsets[s]] == kPoison) {
        poisoned_.push_back(s);
      }
    }
    return ForwardingBackend::Launch(b);
  }
  // poisoned_ is of the one step in flight.
  bool ChainsSteps() const override { return false; }
  absl::Status Wait(StepOutput* out) override {
    if (absl::Status st = ForwardingBackend::Wait(out); !st.ok()) return st;
    for (int s : poisoned_) {  // as a sampler reports logits that are not finite
      out->tokens[s] = -1;
      out->nonfinite[s] = 1;
    }
    return absl::OkStatus();
  }

 private:
  std::vector<int> poisoned_;
};

TEST(EngineTest, NonFiniteLogitsEndOnlyThatRequest) {
  EngineOptions o;
  o.kv_num_blocks = {64, 32};
  auto created = Engine::Create(std::make_unique<PoisonedPrefill>(LoadBackend()), nullptr, o);
  ASSERT_TRUE(created.ok());
  Engine& engine = **created;
  std::vector<int32_t> victim_prompt = RandomPrompt(6, 81);
  victim_prompt[0] = PoisonedPrefill::kPoison;
  const GenerationRequest a = Greedy(RandomPrompt(8, 82), 30);
  const GenerationRequest b = Greedy(RandomPrompt(11, 83), 30);
  auto ha = engine.Enqueue(a);
  auto hv = engine.Enqueue(Greedy(victim_prompt, 30));
  auto hb = engine.Enqueue(b);
  ASSERT_TRUE(ha.ok() && hv.ok() && hb.ok());
  Collected ca, cv, cb;
  ca.Drain(ha->stream());
  cv.Drain(hv->stream());
  cb.Drain(hb->stream());
  EXPECT_EQ(cv.final_chunk.finish_reason, FinishReason::kError);
  EXPECT_EQ(cv.final_chunk.error.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(cv.tokens.empty());
  EXPECT_EQ(ca.ids(), Reference(a.prompt_tokens, 30));
  EXPECT_EQ(cb.ids(), Reference(b.prompt_tokens, 30));
  EXPECT_TRUE(engine.Stats().healthy);
}

TEST(EngineTest, BackendFailureIsFatalAndReported) {
  EngineOptions o;
  o.kv_num_blocks = {64, 32};
  auto created =
      Engine::Create(std::make_unique<FailingBackend>(LoadBackend(), /*fail_at=*/5), nullptr, o);
  ASSERT_TRUE(created.ok());
  Engine& engine = **created;
  EXPECT_TRUE(engine.Stats().healthy);
  auto a = engine.Enqueue(Greedy(RandomPrompt(8, 1), 50));
  auto b = engine.Enqueue(Greedy(RandomPrompt(9, 2), 50));
  ASSERT_TRUE(a.ok() && b.ok());
  Collected ca, cb;
  ca.Drain(a->stream());
  cb.Drain(b->stream());
  for (const Collected* c : {&ca, &cb}) {
    EXPECT_EQ(c->final_chunk.finish_reason, FinishReason::kError);
    EXPECT_EQ(c->final_chunk.error.code(), absl::StatusCode::kInternal);
    EXPECT_NE(c->final_chunk.error.message().find("injected device fault"), std::string::npos);
    EXPECT_LT(c->tokens.size(), 50u);
  }
  const EngineStats st = engine.Stats();
  EXPECT_FALSE(st.healthy);
  EXPECT_NE(st.failure.find("injected device fault"), std::string::npos);
  EXPECT_EQ(st.kv_blocks_used[0], 0);
  EXPECT_EQ(st.num_running, 0);
  auto late = engine.Enqueue(Greedy(RandomPrompt(4, 3), 4));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kUnavailable);
}

// Pipelined steps: a failed Launch (a step in flight) or a failed Wait (the next step
// launched) fails every request cleanly, both steps' included: no hang, every block freed,
// the engine unhealthy.
class WaitFailingBackend : public testing::ForwardingBackend {
 public:
  WaitFailingBackend(std::unique_ptr<Backend> inner, int fail_at)
      : ForwardingBackend(std::move(inner)), fail_at_(fail_at) {}
  absl::Status Wait(StepOutput* out) override {
    if (waits_++ == fail_at_) return absl::InternalError("injected device fault");
    return ForwardingBackend::Wait(out);
  }

 private:
  int fail_at_;
  int waits_ = 0;
};

TEST(EngineTest, PipelinedBackendFailureFailsBothStepsInFlight) {
  for (const bool at_wait : {false, true}) {
    EngineOptions o;
    o.kv_num_blocks = {64, 32};
    o.pipeline_steps = PipelineSteps::kOn;
    std::unique_ptr<Backend> backend =
        at_wait ? std::unique_ptr<Backend>(std::make_unique<WaitFailingBackend>(LoadBackend(), 5))
                : std::make_unique<FailingBackend>(LoadBackend(), 5);
    auto created = Engine::Create(std::move(backend), nullptr, o);
    ASSERT_TRUE(created.ok());
    Engine& engine = **created;
    const std::vector<int32_t> pa = RandomPrompt(8, 1);
    auto a = engine.Enqueue(Greedy(pa, 50));
    auto b = engine.Enqueue(Greedy(RandomPrompt(9, 2), 50));
    ASSERT_TRUE(a.ok() && b.ok());
    Collected ca, cb;
    ca.Drain(a->stream());
    cb.Drain(b->stream());
    for (const Collected* c : {&ca, &cb}) {
      EXPECT_EQ(c->final_chunk.finish_reason, FinishReason::kError) << at_wait;
      EXPECT_NE(c->final_chunk.error.message().find("injected device fault"), std::string::npos);
      EXPECT_LT(c->tokens.size(), 50u);
    }
    const std::vector<int32_t> reference = Reference(pa, 50);
    EXPECT_EQ(ca.ids(),
              std::vector<int32_t>(reference.begin(), reference.begin() + ca.ids().size()));
    const EngineStats st = engine.Stats();
    EXPECT_FALSE(st.healthy);
    EXPECT_GT(st.chained_steps, 0);
    EXPECT_EQ(st.kv_blocks_used[0], 0);
    EXPECT_EQ(st.kv_blocks_used[1], 0);
    EXPECT_EQ(st.num_running, 0);
    EXPECT_EQ(engine.Enqueue(Greedy(RandomPrompt(4, 3), 4)).status().code(),
              absl::StatusCode::kUnavailable);
  }
}

// Cancelled while a pipelined step computes its next token (the step hook holds the loop
// with that step in flight until the cancel is in): the request ends with the 5 tokens it
// had, the reference's first 5; its row of the step in flight is dropped; every block is
// freed; the request it shared its steps with generates its reference.
TEST(EngineTest, PipelinedCancelWithAStepInFlight) {
  absl::Notification at_five, cancelled;  // outlive the engine, whose loop runs the hook
  EngineOptions o;
  o.kv_num_blocks = {64, 32};
  o.pipeline_steps = PipelineSteps::kOn;
  auto engine = MakeEngine(o);
  const std::vector<int32_t> prompt = RandomPrompt(20, 7), other = RandomPrompt(13, 8);
  int pending_at_cancel = -1;
  engine->SetStepHookForTesting(
      [&](const KvCacheManager&, const std::vector<const Sequence*>& running) {
        for (const Sequence* s : running) {
          if (std::equal(prompt.begin(), prompt.end(), s->tokens.begin()) &&
              s->num_generated() - s->num_pending == 5 && !at_five.HasBeenNotified()) {
            pending_at_cancel = s->num_pending;
            at_five.Notify();
            cancelled.WaitForNotification();
          }
        }
      });
  auto victim = engine->Enqueue(Greedy(prompt, 200));
  auto survivor = engine->Enqueue(Greedy(other, 40));
  ASSERT_TRUE(victim.ok() && survivor.ok());
  at_five.WaitForNotification();
  victim->Cancel();
  cancelled.Notify();
  Collected cv, cs;
  cv.Drain(victim->stream());
  cs.Drain(survivor->stream());
  EXPECT_EQ(pending_at_cancel, 1) << "no step was in flight";
  EXPECT_EQ(cv.final_chunk.finish_reason, FinishReason::kCancelled);
  const std::vector<int32_t> reference = Reference(prompt, 200);
  EXPECT_EQ(cv.ids(), std::vector<int32_t>(reference.begin(), reference.begin() + 5));
  EXPECT_EQ(cv.final_chunk.usage.generated_tokens, 5);
  EXPECT_EQ(cs.ids(), Reference(other, 40));
  const EngineStats st = engine->Stats();
  EXPECT_EQ(st.pipeline_dropped_tokens, 1);  // the victim's decode row of the step in flight
  EXPECT_EQ(st.kv_blocks_used[0], 0);
  EXPECT_EQ(st.kv_blocks_used[1], 0);
  EXPECT_EQ(st.num_running, 0);
}

// Shutdown with a step in flight: the loop waits for it, emits its tokens and cancels every
// request; streams end with kCancelled and a prefix of their reference. (Under ASan, a
// pointer to a destroyed request kept by the step in flight would be a use-after-free.) The
// step hook shows the step in flight: after the last step before the shutdown, both
// sequences had their next token pending; after the shutdown, nothing runs.
TEST(EngineTest, PipelinedShutdownWithAStepInFlight) {
  EngineOptions o;
  o.kv_num_blocks = {64, 32};
  o.pipeline_steps = PipelineSteps::kOn;
  auto engine = MakeEngine(o);
  struct AfterStep {
    int running = 0, pending = 0;
  };
  std::vector<AfterStep> after_steps;  // read once the loop thread is joined
  engine->SetStepHookForTesting(
      [&](const KvCacheManager&, const std::vector<const Sequence*>& running) {
        AfterStep a;
        a.running = static_cast<int>(running.size());
        for (const Sequence* s : running) a.pending += s->num_pending;
        after_steps.push_back(a);
      });
  const std::vector<int32_t> p0 = RandomPrompt(10, 61), p1 = RandomPrompt(12, 62);
  auto h0 = engine->Enqueue(Greedy(p0, 200));
  auto h1 = engine->Enqueue(Greedy(p1, 200));
  ASSERT_TRUE(h0.ok() && h1.ok());
  Collected c0, c1;
  c0.TakeOne(h0->stream());
  c1.TakeOne(h1->stream());
  engine.reset();
  ASSERT_GE(after_steps.size(), 2u);
  EXPECT_EQ(after_steps[after_steps.size() - 2].running, 2);
  EXPECT_EQ(after_steps[after_steps.size() - 2].pending, 2) << "no step was in flight";
  EXPECT_EQ(after_steps.back().running, 0);
  c0.Drain(h0->stream());
  c1.Drain(h1->stream());
  for (const auto& [c, p] : {std::make_pair(&c0, &p0), std::make_pair(&c1, &p1)}) {
    EXPECT_EQ(c->final_chunk.finish_reason, FinishReason::kCancelled);
    const std::vector<int32_t> reference = Reference(*p, 200);
    ASSERT_LT(c->ids().size(), reference.size());
    EXPECT_EQ(c->ids(),
              std::vector<int32_t>(reference.begin(), reference.begin() + c->ids().size()));
  }
}

// The step times reported to the observer never overlap (EngineObserver::OnStep), pipelined
// or not: they add up to at most the time the requests took. Counted from each step's
// planning, pipelined steps would add up to about twice the time the loop was busy (each
// would also span the next step's planning and launch).
TEST(EngineTest, StepTimesAddUpToAtMostTheElapsedTime) {
  for (const PipelineSteps mode : {PipelineSteps::kOff, PipelineSteps::kOn}) {
    CountingObserver obs;
    EngineOptions o;
    o.kv_num_blocks = {64, 32};
    o.pipeline_steps = mode;
    auto created = Engine::Create(LoadBackend(), nullptr, o, &obs);
    ASSERT_TRUE(created.ok()) << created.status();
    Engine& engine = **created;
    const absl::Time start = absl::Now();
    auto a = engine.Enqueue(Greedy(RandomPrompt(12, 71), 60));
    auto b = engine.Enqueue(Greedy(RandomPrompt(7, 72), 60));
    ASSERT_TRUE(a.ok() && b.ok());
    Collected ca, cb;
    ca.Drain(a->stream());
    cb.Drain(b->stream());
    const absl::Duration elapsed = absl::Now() - start;
    absl::MutexLock l(&obs.mu);
    EXPECT_EQ(obs.steps, engine.Stats().steps) << PipelineStepsName(mode);
    EXPECT_GT(obs.step_times, absl::ZeroDuration());
    EXPECT_LE(obs.step_times, elapsed) << PipelineStepsName(mode);
  }
}

// The mode in effect: auto pipelines where Launch returns early (cuda-sim) and not on the
// CPU; on pipelines wherever the backend chains steps; a backend that cannot gets none.
class NonChainingBackend : public testing::ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  bool ChainsSteps() const override { return false; }
};

TEST(EngineTest, PipelineStepsModeResolvesByBackend) {
  EXPECT_EQ(*ParsePipelineSteps("auto"), PipelineSteps::kAuto);
  EXPECT_EQ(*ParsePipelineSteps("on"), PipelineSteps::kOn);
  EXPECT_EQ(*ParsePipelineSteps("off"), PipelineSteps::kOff);
  EXPECT_EQ(ParsePipelineSteps("yes").status(),
            absl::InvalidArgumentError("pipeline steps 'yes': expected auto, on or off"));
  const auto mode = [](std::unique_ptr<Backend> backend, PipelineSteps asked) {
    EngineOptions o;
    o.kv_num_blocks = {8, 8};
    o.pipeline_steps = asked;
    auto e = Engine::Create(std::move(backend), nullptr, o);
    EXPECT_TRUE(e.ok()) << e.status();
    EXPECT_EQ((*e)->Stats().pipelining, (*e)->options().pipeline_steps == PipelineSteps::kOn);
    return (*e)->options().pipeline_steps;
  };
  EXPECT_EQ(mode(LoadBackend(), PipelineSteps::kAuto), PipelineSteps::kOff);
  EXPECT_EQ(mode(LoadBackend(), PipelineSteps::kOn), PipelineSteps::kOn);
  EXPECT_EQ(mode(LoadBackend(), PipelineSteps::kOff), PipelineSteps::kOff);
  EXPECT_EQ(mode(LoadBackend(BackendKind::kCudaSim), PipelineSteps::kAuto), PipelineSteps::kOn);
  EXPECT_EQ(mode(LoadBackend(BackendKind::kCudaSim), PipelineSteps::kOff), PipelineSteps::kOff);
  EXPECT_EQ(mode(std::make_unique<NonChainingBackend>(LoadBackend()), PipelineSteps::kOn),
            PipelineSteps::kOff);
}

// A device fault under cuda-sim (the emulator makes an error sticky, as a GPU does after an
// illegal address): the step fails, the engine ends the requests in flight with INTERNAL,
// reports itself unhealthy and refuses new requests; the backend's health() names the fault.
class StickyFaultBackend : public testing::ForwardingBackend {
 public:
  StickyFaultBackend(std::unique_ptr<Backend> inner, int fault_at)
      : ForwardingBackend(std::move(inner)), fault_at_(fault_at) {}
  absl::Status Launch(const StepBatch& b) override {
    if (steps_++ == fault_at_) {
      dcf::simt::InjectStickyError(cudaErrorIllegalAddress, "injected illegal address");
    }
    return ForwardingBackend::Launch(b);
  }

 private:
  int fault_at_;
  int steps_ = 0;
};

TEST(EngineTest, StickyDeviceFaultOnCudaSimIsFatalAndReported) {
  EngineOptions o;
  o.kv_num_blocks = {64, 32};
  auto faulty = std::make_unique<StickyFaultBackend>(LoadBackend(BackendKind::kCudaSim), 3);
  const StickyFaultBackend* backend = faulty.get();
  auto created = Engine::Create(std::move(faulty), nullptr, o);
  ASSERT_TRUE(created.ok()) << created.status();
  Engine& engine = **created;
  EXPECT_TRUE(engine.Stats().healthy);
  auto a = engine.Enqueue(Greedy(RandomPrompt(8, 1), 50));
  ASSERT_TRUE(a.ok());
  Collected ca;
  ca.Drain(a->stream());
  dcf::simt::ClearErrors();  // the emulator's state is process-wide: leave it clean
  EXPECT_EQ(ca.final_chunk.finish_reason, FinishReason::kError);
  EXPECT_EQ(ca.final_chunk.error.code(), absl::StatusCode::kInternal);
  EXPECT_NE(ca.final_chunk.error.message().find("cudaErrorIllegalAddress"), std::string::npos)
      << ca.final_chunk.error.message();
  EXPECT_LT(ca.tokens.size(), 50u);
  const EngineStats st = engine.Stats();
  EXPECT_FALSE(st.healthy);
  EXPECT_NE(st.failure.find("cudaErrorIllegalAddress"), std::string::npos) << st.failure;
  // The backend stays failed (fail fast), even with the emulator's error cleared.
  EXPECT_EQ(backend->health().code(), absl::StatusCode::kInternal);
  auto late = engine.Enqueue(Greedy(RandomPrompt(4, 3), 4));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kUnavailable);
}

// The emulator's trace (DCF_SIMT_TRACE, engine/simt/trace.h) marks every step of the CUDA
// backend and holds what the step issued: its kernels and GEMMs, one upload of the step
// arrays from page-locked memory, the logits download and one wait.
TEST(EngineTest, CudaSimTraceMarksEveryBackendStep) {
  std::unique_ptr<Backend> backend = LoadBackend(BackendKind::kCudaSim);
  const int n_layer = backend->config().n_layer;
  auto runner = SequenceRunner::Create(backend.get(), 16);
  ASSERT_TRUE(runner.ok()) << runner.status();
  const std::string path = ::testing::TempDir() + "/engine_test_trace.jsonl";
  std::remove(path.c_str());
  dcf::simt::SetTraceFile(path);
  std::vector<float> logits;
  const absl::Status st = (*runner)->Append(RandomPrompt(10, 5), 4, &logits);
  dcf::simt::SetTraceFile("");
  ASSERT_TRUE(st.ok()) << st;
  std::ifstream in(path);
  struct Step {
    int kernels = 0, gemms = 0, uploads = 0, downloads = 0, waits = 0, others = 0;
    std::string header;
  };
  std::vector<Step> steps;
  for (std::string line; std::getline(in, line);) {
    if (absl::StrContains(line, "\"kind\":\"step\"")) {
      steps.emplace_back();
      steps.back().header = line;
      continue;
    }
    ASSERT_FALSE(steps.empty()) << "before the first step: " << line;
    Step& s = steps.back();
    if (absl::StrContains(line, "\"kind\":\"kernel\"")) {
      ++s.kernels;
    } else if (absl::StrContains(line, "\"kind\":\"gemm\"")) {
      ++s.gemms;
    } else if (absl::StrContains(line, "\"dir\":\"h2d\",") &&
               absl::StrContains(line, "\"async\":true,\"pinned\":true")) {
      ++s.uploads;
    } else if (absl::StrContains(line, "\"dir\":\"d2h\"")) {
      ++s.downloads;
    } else if (absl::StrContains(line, "cudaEventSynchronize")) {
      ++s.waits;
    } else if (!absl::StrContains(line, "\"kind\":\"event\"")) {
      ++s.others;
      ADD_FAILURE() << "unexpected: " << line;
    }
  }
  std::remove(path.c_str());
  ASSERT_EQ(steps.size(), 3u);  // chunks of 4, 4 and 2 tokens
  const int tokens[] = {4, 4, 2};
  for (int i = 0; i < 3; ++i) {
    const Step& s = steps[i];
    EXPECT_EQ(s.header, absl::StrCat("{\"kind\":\"step\",\"tokens\":", tokens[i], ",\"seqs\":1}"));
    EXPECT_GE(s.kernels, 5 * n_layer) << "step " << i;  // norms, RoPE, dyn weights, KV, DCMHA
    EXPECT_EQ(s.gemms, 4 * n_layer + 1) << "step " << i;  // in, out, up, down; the logits
    EXPECT_EQ(s.uploads, 1) << "step " << i;
    EXPECT_EQ(s.downloads, 1) << "step " << i;  // the logits the runner asked for
    EXPECT_EQ(s.waits, 1) << "step " << i;
  }
}

// SetPenaltyState (every admission with penalties) uploads from page-locked staging and
// never synchronises the stream: its trace is two pinned async copies and an event record
// per call, and a wait only for the event of a staging area being reused while no step
// launched after its copies was waited for (each slot has its own area: six slots wait for
// nothing, slot 0 set again waits for its first upload). What the slots then hold is checked
// by backend_conformance_test (VerifyRowsSampleLikePlainDecoding sets six slots;
// PenaltyUploadsNeverWaitForAStepInFlight: no wait once a later step was waited for).
TEST(EngineTest, CudaSimPenaltyUploadsArePinnedAndNeverSyncTheStream) {
  std::unique_ptr<Backend> backend = LoadBackend(BackendKind::kCudaSim);
  const int V = backend->config().vocab_size;
  StepLimits limits;
  limits.max_tokens = 8;
  limits.max_seqs = 2;
  limits.max_logit_rows = 0;
  limits.blocks_per_seq = 64;
  limits.num_penalty_slots = 6;
  ASSERT_TRUE(backend->Prepare(limits).ok());
  const std::string path = ::testing::TempDir() + "/engine_test_penalty_trace.jsonl";
  std::remove(path.c_str());
  dcf::simt::SetTraceFile(path);
  for (int slot : {0, 1, 2, 3, 4, 5, 0}) {
    const std::vector<int32_t> prompt = {slot + 1, 7}, generated = {slot + 3};
    ASSERT_TRUE(backend->SetPenaltyState(slot, prompt, generated).ok());
  }
  dcf::simt::SetTraceFile("");
  std::ifstream in(path);
  int pinned_uploads = 0, records = 0, event_waits = 0, others = 0;
  size_t upload_bytes = 0;
  for (std::string line; std::getline(in, line);) {
    if (absl::StrContains(line, "\"dir\":\"h2d\",") &&
        absl::StrContains(line, "\"async\":true,\"pinned\":true")) {
      ++pinned_uploads;
      const size_t at = line.find("\"bytes\":") + 8;
      upload_bytes += std::stoul(line.substr(at));
    } else if (absl::StrContains(line, "\"call\":\"record\"")) {
      ++records;
    } else if (absl::StrContains(line, "cudaEventSynchronize")) {
      ++event_waits;
    } else {
      ++others;
      ADD_FAILURE() << "unexpected: " << line;
    }
  }
  std::remove(path.c_str());
  EXPECT_EQ(pinned_uploads, 14);
  EXPECT_EQ(upload_bytes, 7u * (V + 4 * V));  // seen [V] u8 and counts [V] i32 per call
  EXPECT_EQ(records, 7);
  EXPECT_EQ(event_waits, 1);
  EXPECT_EQ(others, 0);
}

// A checkpoint with NaN in its weights (every 7th entry of one wo) on each backend's sampler:
// every request ends with INTERNAL and a message that says the logits were not finite, never
// with a silent token; the observer counts each; the engine stays healthy (the backend did
// not fail) and frees the requests' blocks. SequenceRunner refuses the same way.
TEST_P(EngineBackendTest, NonFiniteLogitsEndTheRequestWithInternal) {
  EngineOptions o;
  o.kv_num_blocks = {64, 32};
  CountingObserver obs;
  auto created = Engine::Create(LoadBackend(GetParam(), /*corrupt=*/true), nullptr, o, &obs);
  ASSERT_TRUE(created.ok()) << created.status();
  Engine& engine = **created;
  GenerationRequest greedy = Greedy(RandomPrompt(9, 71), 20);
  GenerationRequest sampled = Greedy(RandomPrompt(5, 72), 20);
  sampled.sampling.temperature = 0.8f;
  sampled.sampling.top_p = 0.9f;
  sampled.sampling.seed = 3;
  sampled.output.logprobs = true;
  for (const GenerationRequest* r : {&greedy, &sampled}) {
    const Collected c = RunToEnd(engine, *r);
    EXPECT_EQ(c.final_chunk.finish_reason, FinishReason::kError);
    EXPECT_EQ(c.final_chunk.error.code(), absl::StatusCode::kInternal);
    EXPECT_NE(c.final_chunk.error.message().find("not finite (NaN or infinity) at position " +
                                                 std::to_string(r->prompt_tokens.size() - 1)),
              std::string::npos)
        << c.final_chunk.error;
    EXPECT_TRUE(c.tokens.empty());
    EXPECT_EQ(c.final_chunk.usage.generated_tokens, 0);
  }
  absl::MutexLock l(&obs.mu);
  EXPECT_EQ(obs.nonfinite, 2);
  const EngineStats st = engine.Stats();
  EXPECT_TRUE(st.healthy) << st.failure;
  EXPECT_EQ(st.kv_blocks_used[0], 0);
  auto backend = LoadBackend(GetParam(), /*corrupt=*/true);
  auto runner = SequenceRunner::Create(backend.get());
  ASSERT_TRUE(runner.ok());
  const auto greedy_run = (*runner)->Greedy(greedy.prompt_tokens, 5, 16);
  EXPECT_EQ(greedy_run.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(greedy_run.status().message().find("not finite"), std::string::npos);
}

// --- Pipelined steps (EngineOptions::pipeline_steps) against one step at a time ---

struct MixResult {
  std::vector<Collected> got;
  EngineStats stats;
};

// Runs `requests` on an engine of `kind` with pipelined steps `mode`: the first `first` at
// once, then each of the others once request 0 streamed one more chunk (they join while
// steps are in flight), and collects every stream. Every block must be free at the end.
MixResult RunMix(BackendKind kind, EngineOptions o, PipelineSteps mode, const Tokenizer* tok,
                 const std::vector<GenerationRequest>& requests, size_t first) {
  o.pipeline_steps = mode;
  auto engine = MakeEngine(o, tok, kind);
  MixResult res;
  res.got.resize(requests.size());
  std::vector<RequestHandle> handles;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (i >= first && !res.got[0].finished) res.got[0].TakeOne(handles[0].stream());
    auto h = engine->Enqueue(requests[i]);
    EXPECT_TRUE(h.ok()) << h.status();
    if (!h.ok()) return res;
    handles.push_back(std::move(*h));
  }
  for (size_t i = 0; i < requests.size(); ++i) res.got[i].Drain(handles[i].stream());
  res.stats = engine->Stats();
  EXPECT_EQ(res.stats.pipelining, mode == PipelineSteps::kOn);
  EXPECT_EQ(res.stats.kv_blocks_used[0], 0);
  EXPECT_EQ(res.stats.kv_blocks_used[1], 0);
  EXPECT_EQ(res.stats.num_running, 0);
  return res;
}

// The same finish reasons, tokens, text and usage; logprobs and top logprobs within `tol`.
void ExpectSameOutputs(const MixResult& want, const MixResult& got, double tol) {
  ASSERT_EQ(got.got.size(), want.got.size());
  for (size_t i = 0; i < want.got.size(); ++i) {
    const Collected& w = want.got[i];
    const Collected& g = got.got[i];
    EXPECT_EQ(g.final_chunk.finish_reason, w.final_chunk.finish_reason) << "request " << i;
    EXPECT_EQ(g.ids(), w.ids()) << "request " << i;
    EXPECT_EQ(g.text, w.text) << "request " << i;
    EXPECT_EQ(g.final_chunk.usage.generated_tokens, w.final_chunk.usage.generated_tokens);
    ASSERT_EQ(g.tokens.size(), w.tokens.size()) << "request " << i;
    for (size_t t = 0; t < w.tokens.size(); ++t) {
      EXPECT_NEAR(g.tokens[t].logprob, w.tokens[t].logprob, tol) << "request " << i << " " << t;
      ASSERT_EQ(g.tokens[t].top.size(), w.tokens[t].top.size()) << "request " << i << " " << t;
      for (size_t k = 0; k < w.tokens[t].top.size(); ++k) {
        EXPECT_EQ(g.tokens[t].top[k].token, w.tokens[t].top[k].token);
        EXPECT_NEAR(g.tokens[t].top[k].logprob, w.tokens[t].top[k].logprob, tol);
      }
    }
  }
}

// A stop string of two printable ASCII tokens in a row of `ids` (the tiny tokenizer gives
// ids < 256 their byte), from the `from`-th on; empty if there is none.
std::string AsciiPairFrom(const std::vector<int32_t>& ids, size_t from) {
  for (size_t k = from; k + 1 < ids.size(); ++k) {
    if (ids[k] >= 32 && ids[k] < 127 && ids[k + 1] >= 32 && ids[k + 1] < 127) {
      return std::string{static_cast<char>(ids[k]), static_cast<char>(ids[k + 1])};
    }
  }
  return "";
}

// Pipelined steps give exactly the outputs of steps run one at a time (bit for bit on the
// CPU; on cuda-sim float32 the same tokens and logprobs within 1e-4), through requests that
// end while the next step is in flight (a stop id, an EOS, a stop string on the text,
// max_new_tokens, one new token only), greedy requests with logprobs and top logprobs,
// seeded sampling with penalties (the device slot counts each chained token), late arrivals
// that join while steps are in flight and share prompt prefixes with earlier requests
// (prefix caching), chunked prefill. The pipelined run really chained steps and dropped the
// rows of requests that ended with a step in flight.
TEST_P(EngineBackendTest, PipelinedStepsEqualSerialSteps) {
  const bool sim = GetParam() == BackendKind::kCudaSim;
  const int n = sim ? 1 : 2;  // emulated steps cost more: shorter generations
  const auto tok = testing::TinyTokenizer();
  const std::vector<int32_t> shared = RandomPrompt(40, 510);  // 2 full blocks and more
  std::vector<GenerationRequest> r;
  r.push_back(Greedy(shared, 20 * n));
  r.back().output.logprobs = true;
  r.back().output.top_logprobs = 3;
  r.back().stopping.ignore_eos = true;
  const auto p1 = RandomPrompt(9, 511), p2 = RandomPrompt(14, 512), p3 = RandomPrompt(8, 31);
  r.push_back(Greedy(p1, 30));
  r.back().stopping.stop_token_ids = {Reference(p1, 30)[6]};
  r.push_back(Greedy(p2, 30));
  r.back().stopping.eos_token_id = Reference(p2, 30)[4];
  r.push_back(Greedy(p3, 40));
  r.back().output.text = true;
  r.back().stopping.ignore_eos = true;
  const std::string stop = AsciiPairFrom(Reference(p3, 40), 3);
  ASSERT_FALSE(stop.empty()) << "no two printable ASCII tokens in a row";
  r.back().stopping.stop_strings = {stop};
  GenerationRequest sampled;
  sampled.prompt_tokens = RandomPrompt(11, 514);
  sampled.sampling.temperature = 0.8f;
  sampled.sampling.top_k = 50;
  sampled.sampling.repetition_penalty = 1.3f;
  sampled.sampling.presence_penalty = 0.3f;
  sampled.sampling.frequency_penalty = 0.2f;
  sampled.sampling.seed = 5;
  sampled.stopping.max_new_tokens = 15 * n;
  sampled.stopping.ignore_eos = true;
  sampled.output.text = false;
  sampled.output.logprobs = true;
  sampled.output.top_logprobs = 2;
  r.push_back(sampled);
  GenerationRequest one = sampled;  // ends at its first token
  one.prompt_tokens = RandomPrompt(6, 515);
  one.sampling = SamplingParams();
  one.sampling.temperature = 1.0f;
  one.sampling.top_p = 0.9f;
  one.sampling.seed = 9;
  one.stopping.max_new_tokens = 1;
  r.push_back(one);
  const size_t first = r.size();
  // Late arrivals: a shared prefix (a hit on request 0's prompt blocks), a short one, the
  // sampled request's prompt continued.
  std::vector<int32_t> p6(shared.begin(), shared.begin() + 35);
  for (int32_t t : RandomPrompt(5, 516)) p6.push_back(t);
  r.push_back(Greedy(p6, 10 * n));
  r.back().stopping.ignore_eos = true;
  r.push_back(Greedy(RandomPrompt(20, 517), 3));
  r.back().stopping.ignore_eos = true;
  GenerationRequest continued = sampled;
  continued.prompt_tokens.insert(continued.prompt_tokens.end(), {4, 5, 6});
  continued.sampling.seed = 11;
  continued.stopping.max_new_tokens = 12 * n;
  r.push_back(continued);

  EngineOptions o;
  o.kv_num_blocks = {64, 32};
  o.max_num_seqs = 8;
  o.max_num_batched_tokens = 24;
  o.max_prefill_chunk_tokens = 16;
  const MixResult serial = RunMix(GetParam(), o, PipelineSteps::kOff, tok.get(), r, first);
  ASSERT_FALSE(HasFatalFailure());
  const MixResult pipelined = RunMix(GetParam(), o, PipelineSteps::kOn, tok.get(), r, first);
  ASSERT_FALSE(HasFatalFailure());
  ExpectSameOutputs(serial, pipelined, sim ? 1e-4 : 0.0);
  // Each stop rule ended its request early, as the serial run did.
  EXPECT_EQ(serial.got[1].final_chunk.finish_reason, FinishReason::kStopToken);
  EXPECT_EQ(serial.got[2].final_chunk.finish_reason, FinishReason::kEos);
  EXPECT_EQ(serial.got[3].final_chunk.finish_reason, FinishReason::kStopString);
  EXPECT_EQ(serial.got[5].ids().size(), 1u);
  EXPECT_GT(serial.stats.prefix_cache_hits, 0);
  EXPECT_EQ(serial.stats.chained_steps, 0);
  EXPECT_GT(pipelined.stats.chained_steps, pipelined.stats.steps / 2);
  // One dropped row (a decode token) for each request a stop rule ended while its next step
  // was in flight: the stop id, the EOS, the stop string. None for those that end by length
  // (max_new_tokens, the one-token request): their last step is known ahead.
  EXPECT_EQ(pipelined.stats.pipeline_dropped_tokens, 3);
  EXPECT_GT(pipelined.stats.prefix_cache_hits, 0);
  EXPECT_EQ(serial.stats.tokens_generated, pipelined.stats.tokens_generated);
}

// Speculative decoding mixed in: sequences that may draft run serially (their proposer needs
// their real last token), the others pipelined; the outputs are those of serial steps (and
// of plain decoding).
TEST_P(EngineBackendTest, PipelinedStepsWithSpeculatingRequestsEqualSerialSteps) {
  const bool sim = GetParam() == BackendKind::kCudaSim;
  std::vector<GenerationRequest> r;
  // A copy-heavy prompt (a phrase repeated) that drafts well, speculating; then requests that
  // do not speculate.
  std::vector<int32_t> phrase = RandomPrompt(3, 520), copy;
  for (int i = 0; i < 4; ++i) copy.insert(copy.end(), phrase.begin(), phrase.end());
  // The others outlive the speculating ones: their last steps are pipelined.
  r.push_back(Greedy(copy, 12));
  for (int i = 0; i < 3; ++i) {
    r.push_back(Greedy(RandomPrompt(7 + 5 * i, 521 + i), sim ? 24 : 30));
    r.back().speculate = false;
  }
  r.push_back(Greedy(copy, 10));  // a late speculating arrival
  r.back().prompt_tokens.push_back(3);
  EngineOptions o;
  o.kv_num_blocks = {64, 32};
  o.max_num_seqs = 8;
  o.spec_tokens = 3;
  o.spec_step_tokens = 16;  // no measurement (it would differ between the engines)
  o.spec_ngram_min = 1;     // draft as often as possible
  o.spec_adaptive = false;
  const MixResult serial = RunMix(GetParam(), o, PipelineSteps::kOff, nullptr, r, 4);
  ASSERT_FALSE(HasFatalFailure());
  const MixResult pipelined = RunMix(GetParam(), o, PipelineSteps::kOn, nullptr, r, 4);
  ASSERT_FALSE(HasFatalFailure());
  ExpectSameOutputs(serial, pipelined, sim ? 1e-4 : 0.0);
  for (size_t i = 0; i < r.size(); ++i) {
    EXPECT_EQ(pipelined.got[i].ids(),
              Reference(r[i].prompt_tokens, r[i].stopping.max_new_tokens, GetParam()))
        << "request " << i;
  }
  EXPECT_GT(pipelined.stats.spec_drafted_tokens, 0);
  EXPECT_GT(pipelined.stats.spec_accepted_tokens, 0);
  EXPECT_GT(pipelined.stats.chained_steps, 0);
  EXPECT_LT(pipelined.stats.chained_steps, pipelined.stats.steps);
  // Every request ends by length, known ahead: no row is computed for nothing.
  EXPECT_EQ(pipelined.stats.pipeline_dropped_tokens, 0);
}

// Prefix caching after a pipelined run: a request whose prompt is an earlier request's
// prompt and output reuses the blocks that its chained steps wrote (rows of tokens the host
// knew only after their step was launched) and generates what it generates alone, without a
// cache.
TEST_P(EngineBackendTest, PrefixCacheAfterPipelinedStepsHoldsTheRightRows) {
  EngineOptions o;
  o.kv_num_blocks = {64, 32};
  o.pipeline_steps = PipelineSteps::kOn;
  auto engine = MakeEngine(o, nullptr, GetParam());
  const std::vector<int32_t> prompt = RandomPrompt(20, 530);
  const std::vector<int32_t> a = RunToEnd(*engine, Greedy(prompt, 40)).ids();
  ASSERT_EQ(a.size(), 40u);
  std::vector<int32_t> again = prompt;
  again.insert(again.end(), a.begin(), a.begin() + 36);  // 56 tokens
  again.push_back(7);
  const Collected b = RunToEnd(*engine, Greedy(again, 12));
  // Blocks of 16: the hit is the 3 full blocks (48 tokens), 28 of them generated by A.
  EXPECT_EQ(b.final_chunk.usage.cached_tokens, 48);
  EXPECT_EQ(b.ids(), Reference(again, 12, GetParam()));
  EXPECT_GT(engine->Stats().chained_steps, 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, EngineBackendTest,
                         ::testing::Values(BackendKind::kCpu, BackendKind::kCudaSim),
                         [](const auto& info) { return KindName(info.param); });

}  // namespace
}  // namespace dcf
