// What every backend must do, run for each backend this machine has: the CPU oracle and the
// CUDA backend's kernels on the SIMT emulator (cuda-sim, float32). One binary
// (backend_conformance_test) of several files, helpers in backend_conformance_util.h.
//
// This file: chained steps (each launched before the previous one is waited for) against steps
// fed from the host, a Launch after a step that returns logits, and penalty uploads with a
// step in flight.
#include <string>
#include <vector>

#include "engine/backends/backend_factory.h"
#include "engine/simt/simt_testing.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"
#include "tests/unit/backends/backend_conformance_util.h"

namespace dcf::conformance_test {
namespace {

// Test hook: the device runs ahead of the host, as a GPU may (the host descheduled between
// Launch and Wait): every step launched so far completes, its results copied to the host,
// before the host waits for the earlier one. cuda-sim otherwise runs queued work only up to
// what the host waits for (device_queue.h), so the next step's download would never have
// run at a Wait. The CPU computes a step at Launch: nothing to do.
void LetDeviceRunAhead(BackendKind kind) {
  if (kind == BackendKind::kCudaSim) simt::RunQueuedWork();
}

// Chained steps (step_batch.h, Backend::ChainsSteps): each step is launched before the
// previous one is waited for, its decode tokens chained to the slots where the previous step
// samples them; the outputs are those of the same steps run one at a time with the tokens fed
// from the host: the same tokens, logprobs and top logprobs (bit for bit on the CPU, which
// runs the same host code; within 1e-4 on cuda-sim). Sequence A samples with penalties (its
// slot counts each chained token before the next is drawn), B greedily, C joins mid-way
// (a prefill chunk that samples nothing, so the previous step's slots and sampled rows
// differ, then its last chunk); the sequence order changes every step. Every other step the
// device runs ahead (LetDeviceRunAhead): step k's results are downloaded before step k - 1's
// are read, which must not overwrite them (two result buffers). A chained token the
// previous step did not sample and a third step in flight are refused without harm.
TEST_P(BackendTest, ChainedStepsEqualStepsFedFromTheHost) {
  auto model = Load("dcformer-f32-short-prompt", GetParam());
  ASSERT_TRUE(model.ok());
  Backend& backend = *model->backend;
  ASSERT_TRUE(backend.ChainsSteps());
  StepLimits limits;
  limits.max_tokens = 32;
  limits.max_seqs = 4;
  limits.max_logit_rows = 0;
  limits.blocks_per_seq = 64;
  limits.num_penalty_slots = 1;
  KvCacheShape shape;
  shape.block_size = 4;
  shape.window = 16;
  shape.num_blocks = {64, 64};
  const std::vector<std::vector<int32_t>> prompts = {
      {5, 17, 42, 7}, {9, 3, 11, 250, 8}, {1, 2, 3, 4, 5, 6, 7, 8}};
  std::vector<SamplingRow> rows(3);
  rows[0].params.temperature = 0.9f;
  rows[0].params.top_k = 40;
  rows[0].params.repetition_penalty = 1.3f;
  rows[0].params.frequency_penalty = 0.5f;
  rows[0].seed = 99;
  rows[0].penalty_slot = 0;
  rows[0].logprob = true;
  rows[0].top_logprobs = 5;
  rows[1].params.temperature = 0;
  rows[1].logprob = true;
  rows[1].top_logprobs = 3;
  rows[2].params.temperature = 1.2f;
  rows[2].params.top_p = 0.9f;
  rows[2].seed = 7;
  // Each step's entries: {sequence, prompt tokens to feed (0: decode its last token)}.
  std::vector<std::vector<std::pair<int, int>>> plan = {
      {{0, 4}, {1, 5}}, {{2, 3}, {0, 0}, {1, 0}}, {{0, 0}, {2, 5}, {1, 0}}};
  for (int k = 3; k < 9; ++k) {
    plan.push_back(k % 2 ? std::vector<std::pair<int, int>>{{1, 0}, {0, 0}, {2, 0}}
                         : std::vector<std::pair<int, int>>{{2, 0}, {1, 0}, {0, 0}});
  }
  const int steps = static_cast<int>(plan.size());
  const auto run = [&](bool chained, std::vector<StepOutput>* outs) {
    ASSERT_TRUE(backend.Prepare(limits).ok());
    ASSERT_TRUE(backend.AllocateCache(shape).ok());
    ASSERT_TRUE(backend.SetPenaltyState(0, prompts[0], {}).ok());
    KvCacheManager manager(shape);
    std::vector<SequenceKv> kv(3);
    std::vector<int> fed(3, 0), generated(3, 0);
    std::vector<int32_t> last(3, -1), slot(3, -1);  // last token and its slot (last step)
    std::vector<StepBatch> batches(steps);
    outs->assign(steps, StepOutput());
    for (int k = 0; k < steps; ++k) {
      StepBatch& b = batches[k];
      b.Reset(limits.blocks_per_seq);
      std::vector<int> sampler;  // [S] the sequence each entry samples for, or -1
      for (const auto& [s, n] : plan[k]) {
        std::vector<int32_t> tokens;
        if (n > 0) {
          tokens.assign(prompts[s].begin() + fed[s], prompts[s].begin() + fed[s] + n);
          fed[s] += n;
        } else {
          tokens = {chained ? ChainedToken(slot[s]) : last[s]};
        }
        const int count = static_cast<int>(tokens.size());
        ASSERT_TRUE(manager.Reserve(kv[s], kv[s].num_tokens + count).ok());
        const bool samples = fed[s] == static_cast<int>(prompts[s].size());
        SamplingRow row = rows[s];
        row.step = generated[s];
        b.AddSequence(tokens, kv[s], samples, row, false);
        manager.Commit(kv[s], kv[s].num_tokens + count);
        sampler.push_back(samples ? s : -1);
        if (samples) ++generated[s];
      }
      const std::vector<int32_t> slots = b.slot_offsets();
      if (chained && k == 2) {
        // Slot 0 of step 1 is C's chunk, which samples nothing.
        StepBatch bad = b;
        bad.tokens[0] = ChainedToken(0);
        EXPECT_EQ(backend.Launch(bad).code(), absl::StatusCode::kFailedPrecondition);
      }
      ASSERT_TRUE(backend.Launch(b).ok()) << "step " << k;
      if (chained && k > 0) {
        if (k % 2 == 1) LetDeviceRunAhead(GetParam());
        if (k == 2) {
          EXPECT_EQ(backend.Launch(b).code(), absl::StatusCode::kFailedPrecondition)
              << "a third step in flight";
        }
        ASSERT_TRUE(backend.Wait(&(*outs)[k - 1]).ok());
      }
      if (!chained) {
        ASSERT_TRUE(backend.Wait(&(*outs)[k]).ok());
        for (size_t i = 0; i < sampler.size(); ++i) {
          if (sampler[i] >= 0) last[sampler[i]] = (*outs)[k].tokens[slots[i]];
        }
      }
      for (size_t i = 0; i < sampler.size(); ++i) {
        if (sampler[i] >= 0) slot[sampler[i]] = slots[i];
      }
    }
    if (chained) {
      ASSERT_TRUE(backend.Wait(&(*outs)[steps - 1]).ok());
    }
    StepOutput none;
    EXPECT_EQ(backend.Wait(&none).code(), absl::StatusCode::kFailedPrecondition);
    for (SequenceKv& k : kv) manager.Free(k);
  };
  std::vector<StepOutput> serial, chained;
  run(false, &serial);
  ASSERT_FALSE(HasFatalFailure());
  run(true, &chained);
  ASSERT_FALSE(HasFatalFailure());
  const double tol = GetParam() == BackendKind::kCpu ? 0.0 : 1e-4;
  int sampled = 0;
  for (int k = 0; k < steps; ++k) {
    const StepOutput& want = serial[k];
    const StepOutput& got = chained[k];
    ASSERT_EQ(got.tokens, want.tokens) << "step " << k;
    ASSERT_EQ(got.top_tokens, want.top_tokens) << "step " << k;
    for (size_t i = 0; i < want.tokens.size(); ++i) {
      sampled += want.tokens[i] >= 0;
      EXPECT_NEAR(got.logprobs[i], want.logprobs[i], tol) << "step " << k << " slot " << i;
      for (int j = 0; j < kMaxTopLogprobs; ++j) {
        const size_t at = i * kMaxTopLogprobs + j;
        EXPECT_NEAR(got.top_logprobs[at], want.top_logprobs[at], tol);
      }
    }
  }
  EXPECT_EQ(sampled, 2 + 2 + 3 + 3 * 6);
}

// A step that returns logits must be waited for before the next Launch (backend.h): the CUDA
// backend refuses that Launch (its Wait copies the logits from a buffer the next step would
// overwrite), without harm to the step in flight; the CPU, which computes a step at Launch,
// takes it, and the first step's logits stay those of the step alone.
TEST_P(BackendTest, LaunchAfterAStepThatReturnsLogits) {
  auto model = Load("dcformer-f32-short-prompt", GetParam());
  ASSERT_TRUE(model.ok());
  Backend& backend = *model->backend;
  StepLimits limits;
  limits.max_tokens = 16;
  limits.max_seqs = 1;
  limits.max_logit_rows = 4;  // a chunk that returns logits returns every row's
  limits.blocks_per_seq = 16;
  KvCacheShape shape;
  shape.block_size = 4;
  shape.window = 16;
  shape.num_blocks = {16, 16};
  ASSERT_TRUE(backend.Prepare(limits).ok());
  ASSERT_TRUE(backend.AllocateCache(shape).ok());
  KvCacheManager manager(shape);
  SamplingRow greedy;
  greedy.params.temperature = 0;
  const auto add = [&](const std::vector<int32_t>& tokens, bool logits, SequenceKv* kv,
                       StepBatch* b) {
    ASSERT_TRUE(manager.Reserve(*kv, static_cast<int>(tokens.size())).ok());
    b->Reset(limits.blocks_per_seq);
    b->AddSequence(tokens, *kv, true, greedy, logits);
    manager.Commit(*kv, static_cast<int>(tokens.size()));
  };
  SequenceKv kv_a, kv_b, kv_alone;
  StepBatch with_logits, next, alone;
  add({5, 17, 42, 7}, true, &kv_a, &with_logits);
  add({9, 3, 11}, false, &kv_b, &next);
  add({5, 17, 42, 7}, true, &kv_alone, &alone);
  ASSERT_FALSE(HasFatalFailure());
  StepOutput want, got, second;
  {
    const absl::Status st = backend.Step(alone, &want);
    ASSERT_TRUE(st.ok()) << st;
  }
  ASSERT_TRUE(backend.Launch(with_logits).ok());
  const absl::Status chained = backend.Launch(next);
  if (GetParam() == BackendKind::kCpu) {
    EXPECT_TRUE(chained.ok()) << chained;
  } else {
    EXPECT_EQ(chained.code(), absl::StatusCode::kFailedPrecondition) << chained;
  }
  ASSERT_TRUE(backend.Wait(&got).ok());
  EXPECT_EQ(got.logits, want.logits);
  EXPECT_EQ(got.tokens, want.tokens);
  if (!chained.ok()) {
    ASSERT_TRUE(backend.Launch(next).ok());  // after the Wait: taken
  }
  ASSERT_TRUE(backend.Wait(&second).ok());
  EXPECT_EQ(second.tokens.size(), 1u);
  StepOutput none;
  EXPECT_EQ(backend.Wait(&none).code(), absl::StatusCode::kFailedPrecondition);
  for (SequenceKv* kv : {&kv_a, &kv_b, &kv_alone}) manager.Free(*kv);
}

// Admissions while a pipelined step is in flight, each into a slot whose previous upload a
// step that was waited for has read (as the engine's slots are, but for one admitted and
// cancelled before that step's Wait): the upload waits for nothing on the device, however many
// admissions a step makes (here 6, more than the ring of 4 staging areas the CUDA backend once
// shared between slots, whose 5th reuse waited for the step in flight). Checked on cuda-sim's
// trace: no synchronisation at all between the Launch of the step in flight and its Wait; the
// step's results are right.
TEST_P(BackendTest, PenaltyUploadsNeverWaitForAStepInFlight) {
  if (GetParam() != BackendKind::kCudaSim) GTEST_SKIP() << "counted on cuda-sim's trace";
  auto model = Load("dcformer-f32-short-prompt", GetParam());
  ASSERT_TRUE(model.ok());
  Backend& backend = *model->backend;
  constexpr int kSlots = 6;
  StepLimits limits;
  limits.max_tokens = 16;
  limits.max_seqs = 1;
  limits.max_logit_rows = 0;
  limits.blocks_per_seq = 16;
  limits.num_penalty_slots = kSlots;
  KvCacheShape shape;
  shape.block_size = 4;
  shape.window = 16;
  shape.num_blocks = {16, 16};
  ASSERT_TRUE(backend.Prepare(limits).ok());
  ASSERT_TRUE(backend.AllocateCache(shape).ok());
  const std::vector<int32_t> prompt = {5, 17, 42, 7};
  for (int slot = 0; slot < kSlots; ++slot) {
    ASSERT_TRUE(backend.SetPenaltyState(slot, prompt, {}).ok());
  }
  KvCacheManager manager(shape);
  SequenceKv kv;
  SamplingRow row;
  row.params.temperature = 0;
  row.params.repetition_penalty = 1.3f;
  row.penalty_slot = 0;
  const auto launch = [&](const std::vector<int32_t>& tokens, int step, StepBatch* b) {
    ASSERT_TRUE(manager.Reserve(kv, kv.num_tokens + static_cast<int>(tokens.size())).ok());
    b->Reset(limits.blocks_per_seq);
    row.step = step;
    b->AddSequence(tokens, kv, true, row, false);
    manager.Commit(kv, kv.num_tokens + static_cast<int>(tokens.size()));
    ASSERT_TRUE(backend.Launch(*b).ok());
  };
  StepBatch first, second;
  StepOutput out1, out2;
  launch(prompt, 0, &first);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_TRUE(backend.Wait(&out1).ok());
  launch({ChainedToken(0)}, 1, &second);
  ASSERT_FALSE(HasFatalFailure());
  testing::TempDir dir;
  simt::SetTraceFile(dir.File("trace.jsonl"));
  for (int slot = 1; slot < kSlots; ++slot) {  // readmissions while step 2 is in flight
    ASSERT_TRUE(backend.SetPenaltyState(slot, prompt, {{3, slot}}).ok());
  }
  simt::SetTraceFile("");
  const std::string trace = dir.Read("trace.jsonl");
  EXPECT_EQ(trace.find("\"sync\""), std::string::npos) << trace;
  EXPECT_NE(trace.find("\"h2d\""), std::string::npos) << "no upload traced";
  ASSERT_TRUE(backend.Wait(&out2).ok());
  // Plain decoding's second token: the first fed from the host, without chaining.
  StepBatch host_fed;
  ASSERT_TRUE(backend.SetPenaltyState(0, prompt, {}).ok());
  manager.Free(kv);
  kv = SequenceKv();
  StepOutput want1, want2;
  launch(prompt, 0, &first);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_TRUE(backend.Wait(&want1).ok());
  launch({want1.tokens[0]}, 1, &host_fed);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_TRUE(backend.Wait(&want2).ok());
  EXPECT_EQ(out1.tokens, want1.tokens);
  EXPECT_EQ(out2.tokens, want2.tokens);
  manager.Free(kv);
}

// An upload queued while a step is in flight and read by the next step must survive the
// slot's next upload, made after the earlier step's Wait but before the reading step's: the
// slot's pinned area is reused only once a step launched after its copy was waited for (a
// backend that counted the next step as waited for too reads {} here, not {top}).
TEST_P(BackendTest, PenaltyUploadReadByTheNextStepSurvivesAReupload) {
  if (GetParam() != BackendKind::kCudaSim) GTEST_SKIP() << "cuda-sim";
  auto model = Load("dcformer-f32-short-prompt", GetParam());
  ASSERT_TRUE(model.ok());
  Backend& backend = *model->backend;
  StepLimits limits;
  limits.max_tokens = 16;
  limits.max_seqs = 1;
  limits.max_logit_rows = 0;
  limits.blocks_per_seq = 16;
  limits.num_penalty_slots = 2;
  KvCacheShape shape;
  shape.block_size = 4;
  shape.window = 16;
  shape.num_blocks = {16, 16};
  ASSERT_TRUE(backend.Prepare(limits).ok());
  ASSERT_TRUE(backend.AllocateCache(shape).ok());
  KvCacheManager manager(shape);
  const std::vector<int32_t> prompt = {5, 17, 42, 7}, other = {9, 3, 11, 2};
  SamplingRow row;
  row.params.temperature = 0;
  row.params.repetition_penalty = 1000.0f;
  const auto make = [&](const std::vector<int32_t>& tokens, int slot, SequenceKv* kv,
                        StepBatch* b) {
    ASSERT_TRUE(manager.Reserve(*kv, static_cast<int>(tokens.size())).ok());
    b->Reset(limits.blocks_per_seq);
    row.penalty_slot = slot;
    b->AddSequence(tokens, *kv, true, row, false);
    manager.Commit(*kv, static_cast<int>(tokens.size()));
  };
  // The greedy token of `prompt` with an empty penalty state.
  SequenceKv kv0;
  StepBatch b0;
  ASSERT_TRUE(backend.SetPenaltyState(0, {}, {}).ok());
  make(prompt, 0, &kv0, &b0);
  ASSERT_FALSE(HasFatalFailure());
  StepOutput plain;
  ASSERT_TRUE(backend.Step(b0, &plain).ok());
  const int32_t top = plain.tokens[0];
  manager.Free(kv0);
  // Step P in flight; slot 0 := {top} (read by step Q); Launch Q; Wait P; slot 0 := {}.
  SequenceKv kvp, kvq;
  StepBatch bp, bq;
  make(other, 1, &kvp, &bp);
  make(prompt, 0, &kvq, &bq);
  ASSERT_FALSE(HasFatalFailure());
  ASSERT_TRUE(backend.Launch(bp).ok());
  ASSERT_TRUE(backend.SetPenaltyState(0, {top}, {}).ok());
  ASSERT_TRUE(backend.Launch(bq).ok());
  StepOutput outp, outq;
  ASSERT_TRUE(backend.Wait(&outp).ok());
  ASSERT_TRUE(backend.SetPenaltyState(0, {}, {}).ok());
  ASSERT_TRUE(backend.Wait(&outq).ok());
  EXPECT_NE(outq.tokens[0], top) << "step Q read the later upload";
  manager.Free(kvp);
  manager.Free(kvq);
}

}  // namespace
}  // namespace dcf::conformance_test
