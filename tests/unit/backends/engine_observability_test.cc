// Engine tests on the small golden models (CPU; some also on cuda-sim, the CUDA backend's
// kernels on the SIMT emulator, in float32), one binary (backends_engine_test) of several
// files, helpers in engine_test_util.h. The reference for every greedy output is
// SequenceRunner::Greedy on the same backend: one request, alone. They live with the backends'
// tests because they name concrete backends, which serving never does (tests/unit/serving
// runs on fakes).
//
// This file: what the engine reports: the observer's hooks against EngineStats, step times,
// and on cuda-sim the emulator's trace of each backend step and of the penalty uploads.
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "engine/serving/engine.h"
#include "engine/serving/sequence_runner.h"
#include "gtest/gtest.h"
#include "tests/unit/backends/engine_test_util.h"
#if DCF_ENGINE_TEST_CUDA_SIM
// The emulator's test hooks (inject a sticky device fault, read the trace); plain C++, no
// toolkit.
#include "engine/simt/simt_testing.h"
#endif

namespace dcf::engine_test {
namespace {

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
    auto h = engine->Enqueue(
        Greedy(RandomPrompt(kGrowingCases[i].len, 300 + i), kGrowingCases[i].max_new));
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

#if DCF_ENGINE_TEST_CUDA_SIM
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
    EXPECT_GE(s.kernels, 5 * n_layer) << "step " << i;    // norms, RoPE, dyn weights, KV, DCMHA
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
#endif  // DCF_ENGINE_TEST_CUDA_SIM

}  // namespace
}  // namespace dcf::engine_test
