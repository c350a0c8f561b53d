// Engine tests on the small golden models (CPU; some also on cuda-sim, the CUDA backend's
// kernels on the SIMT emulator, in float32), one binary (backends_engine_test) of several
// files, helpers in engine_test_util.h. The reference for every greedy output is
// SequenceRunner::Greedy on the same backend: one request, alone. They live with the backends'
// tests because they name concrete backends, which serving never does (tests/unit/serving
// runs on fakes).
//
// This file: failures: non-finite logits end only their request (cpu and cuda-sim), a failing
// step is fatal and reported, with or without steps in flight (cancel and shutdown too), and
// a sticky device fault on cuda-sim.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "engine/serving/engine.h"
#include "engine/serving/sequence_runner.h"
#include "gtest/gtest.h"
#include "tests/testing/forwarding_backend.h"
#include "tests/unit/backends/engine_test_util.h"
#if DCF_ENGINE_TEST_CUDA_SIM
// The emulator's test hooks (inject a sticky device fault, read the trace); plain C++, no
// toolkit.
#include "engine/simt/simt_testing.h"
#endif

namespace dcf::engine_test {
namespace {

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

#if DCF_ENGINE_TEST_CUDA_SIM
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
#endif  // DCF_ENGINE_TEST_CUDA_SIM

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

}  // namespace
}  // namespace dcf::engine_test
