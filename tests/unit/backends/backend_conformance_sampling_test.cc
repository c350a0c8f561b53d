// What every backend must do, run for each backend this machine has: the CPU oracle and the
// CUDA backend's kernels on the SIMT emulator (cuda-sim, float32). One binary
// (backend_conformance_test) of several files, helpers in backend_conformance_util.h.
//
// This file: argument checking (cache shapes, batches), the backend's sampler against the host
// reference on the logits it returns with penalties recorded in its slots, and verify steps
// against plain decoding.
#include <algorithm>
#include <vector>

#include "engine/backends/backend_factory.h"
#include "engine/common/status_macros.h"
#include "engine/execution/step_plan.h"
#include "engine/sampling/token_sampler.h"
#include "gtest/gtest.h"
#include "tests/unit/backends/backend_conformance_util.h"

namespace dcf::conformance_test {
namespace {

// A one-sequence batch of `tokens` after `kv` (blocks reserved by the caller).
StepBatch OneSequence(const std::vector<int32_t>& tokens, const SequenceKv& kv, int capacity,
                      bool sample = false, const SamplingRow& row = {}) {
  StepBatch b;
  b.Reset(capacity);
  b.AddSequence(tokens, kv, sample, row, !sample);
  return b;
}

// Prepares `backend` for `limits` and allocates a cache of 64 + 64 blocks of 4 tokens,
// window 16; returns its shape.
absl::StatusOr<KvCacheShape> PrepareWithCache(Backend& backend, const StepLimits& limits) {
  RETURN_IF_ERROR(backend.Prepare(limits).status());
  KvCacheShape shape;
  shape.block_size = 4;
  shape.window = 16;
  shape.num_blocks = {64, 64};
  RETURN_IF_ERROR(backend.AllocateCache(shape));
  return shape;
}

// The same for steps of one sequence of up to `max_tokens` tokens (as many logit rows).
absl::StatusOr<KvCacheShape> PrepareOneSequence(Backend& backend, int max_tokens,
                                                int penalty_slots) {
  StepLimits limits;
  limits.max_tokens = max_tokens;
  limits.max_seqs = 1;
  limits.max_logit_rows = max_tokens;
  limits.blocks_per_seq = 64;
  limits.num_penalty_slots = penalty_slots;
  return PrepareWithCache(backend, limits);
}

TEST_P(BackendTest, RejectsBadCacheShapesAndBatches) {
  auto model = Load("dcformer-f32-short-prompt", GetParam());
  ASSERT_TRUE(model.ok());
  Backend& backend = *model->backend;
  StepLimits limits;
  limits.max_tokens = 8;
  limits.max_seqs = 2;
  limits.max_logit_rows = 8;
  limits.blocks_per_seq = 64;
  limits.num_penalty_slots = 1;
  ASSERT_TRUE(backend.Prepare(limits).ok());
  KvCacheShape shape;
  shape.block_size = 4;
  shape.window = 16;
  shape.num_blocks = {-1, 8};
  EXPECT_EQ(backend.AllocateCache(shape).code(), absl::StatusCode::kInvalidArgument);
  shape.num_blocks = {8, 8};
  shape.window = 4;  // the model's window is 16
  EXPECT_EQ(backend.AllocateCache(shape).code(), absl::StatusCode::kInvalidArgument);
  shape.window = 16;
  ASSERT_TRUE(backend.AllocateCache(shape).ok());

  KvCacheManager manager(shape);
  SequenceKv kv;
  ASSERT_TRUE(manager.Reserve(kv, 3).ok());
  const std::vector<int32_t> tokens = {1, 2, 3};
  StepOutput out;
  EXPECT_EQ(backend.Wait(&out).code(), absl::StatusCode::kFailedPrecondition);  // no Launch
  // Token ids outside the vocabulary.
  EXPECT_EQ(backend.Step(OneSequence({1, 300, 2}, kv, 64), &out).code(),
            absl::StatusCode::kInvalidArgument);
  // Positions that are not consecutive.
  StepBatch gap = OneSequence(tokens, kv, 64);
  gap.positions[2] = 5;
  EXPECT_EQ(backend.Step(gap, &out).code(), absl::StatusCode::kInvalidArgument);
  // More tokens than prepared for.
  EXPECT_EQ(backend.Step(OneSequence(std::vector<int32_t>(9, 1), kv, 64), &out).code(),
            absl::StatusCode::kInvalidArgument);
  // Block tables of another capacity.
  EXPECT_EQ(backend.Step(OneSequence(tokens, kv, 32), &out).code(),
            absl::StatusCode::kInvalidArgument);
  // Penalties without a slot, and a slot that does not exist.
  SamplingRow row;
  row.params.repetition_penalty = 1.5f;
  EXPECT_EQ(backend.Step(OneSequence(tokens, kv, 64, true, row), &out).code(),
            absl::StatusCode::kInvalidArgument);
  row.penalty_slot = 1;
  EXPECT_EQ(backend.Step(OneSequence(tokens, kv, 64, true, row), &out).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend.SetPenaltyState(1, {}, {}).code(), absl::StatusCode::kInvalidArgument);
  // Positions without reserved blocks.
  SequenceKv unreserved;
  EXPECT_EQ(backend.Step(OneSequence(tokens, unreserved, 64), &out).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(backend.Step(OneSequence(tokens, kv, 64), &out).ok());
  EXPECT_EQ(out.logits.size(), 3u * 300);
  manager.Free(kv);
}

// The backend's sampler draws what the host reference draws from the same logits, records
// the tokens of penalised rows in their slot, and returns the logprobs asked for.
TEST_P(BackendTest, SamplesLikeTheHostReference) {
  auto model = Load("dcformer-f32-short-prompt", GetParam());
  ASSERT_TRUE(model.ok());
  Backend& backend = *model->backend;
  const int V = model->config.vocab_size;
  absl::StatusOr<KvCacheShape> shape = PrepareOneSequence(backend, 16, /*penalty_slots=*/1);
  ASSERT_TRUE(shape.ok()) << shape.status();
  KvCacheManager manager(*shape);
  const std::vector<int32_t> prompt = {5, 17, 42, 7};
  ASSERT_TRUE(backend.SetPenaltyState(0, prompt, {}).ok());
  PenaltyState reference(V);
  reference.Reset(prompt, {});
  SamplerScratch scratch;

  SamplingRow row;
  row.params.temperature = 0.9f;
  row.params.top_k = 40;
  row.params.repetition_penalty = 1.3f;
  row.params.frequency_penalty = 0.5f;
  row.seed = 99;
  row.penalty_slot = 0;
  row.logprob = true;
  row.top_logprobs = 5;
  SequenceKv kv;
  std::vector<int32_t> feed = prompt;
  StepOutput out;
  for (int step = 0; step < 12; ++step) {
    ASSERT_TRUE(manager.Reserve(kv, kv.num_tokens + static_cast<int>(feed.size())).ok());
    row.step = step;
    StepBatch b;
    b.Reset(64);
    b.AddSequence(feed, kv, /*sample=*/true, row, /*return_logits=*/true);
    ASSERT_TRUE(backend.Step(b, &out).ok());
    manager.Commit(kv, kv.num_tokens + static_cast<int>(feed.size()));
    const auto last = absl::MakeConstSpan(out.logits).subspan((feed.size() - 1) * V, V);
    const int32_t want = SampleToken(last, row.params, row.seed, row.step, &reference, &scratch);
    ASSERT_EQ(out.tokens[0], want) << "step " << step;
    reference.Record(want);
    std::vector<TopLogprob> top;
    // The CPU backend runs the host code itself; a device computes exp in float.
    const double tol = GetParam() == BackendKind::kCpu ? 0.0 : 1e-4;
    EXPECT_NEAR(out.logprobs[0], ComputeLogprobs(last, want, 5, &top), tol);
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(out.top_tokens[i], top[i].token);
      EXPECT_NEAR(out.top_logprobs[i], top[i].logprob, tol);
    }
    for (int i = 5; i < kMaxTopLogprobs; ++i) EXPECT_EQ(out.top_tokens[i], -1);
    feed = {want};
  }
  manager.Free(kv);
}

// Temperatures below SamplingParams' greedy bound (1e-5) draw the argmax, as 0 does: at 1e-40
// (a denormal) 1 / T overflows a float, at 1e-38 l / T does for |l| >= 3.4, and the draw then
// walked infinities and NaNs (random tokens, an end of text at once).
TEST_P(BackendTest, TinyTemperaturesDrawTheArgmax) {
  auto model = Load("dcformer-f32-short-prompt", GetParam());
  ASSERT_TRUE(model.ok());
  Backend& backend = *model->backend;
  const int V = model->config.vocab_size;
  absl::StatusOr<KvCacheShape> shape = PrepareOneSequence(backend, 8, /*penalty_slots=*/0);
  ASSERT_TRUE(shape.ok()) << shape.status();
  KvCacheManager manager(*shape);
  const std::vector<int32_t> prompt = {5, 17, 42, 7};
  for (float t : {1e-6f, 1e-30f, 1e-38f, 1e-40f}) {
    for (float top_p : {1.0f, 0.9f}) {
      SequenceKv kv;
      ASSERT_TRUE(manager.Reserve(kv, static_cast<int>(prompt.size())).ok());
      SamplingRow row;
      row.params.temperature = t;
      row.params.top_p = top_p;
      row.seed = 7;
      StepBatch b;
      b.Reset(64);
      b.AddSequence(prompt, kv, /*sample=*/true, row, /*return_logits=*/true);
      StepOutput out;
      ASSERT_TRUE(backend.Step(b, &out).ok());
      const auto last = absl::MakeConstSpan(out.logits).subspan((prompt.size() - 1) * V, V);
      const auto argmax = std::max_element(last.begin(), last.end()) - last.begin();
      EXPECT_EQ(out.tokens[0], argmax) << "temperature " << t << ", top_p " << top_p;
      manager.Free(kv);
    }
  }
}

// Verification (speculative decoding) through the backend: a sequence's chunk of its last
// token and k drafts samples each of its k + 1 rows as plain decoding would (row j: draw
// step + j, penalties counting drafts [0, j)), up to the first row that differs from its
// draft (later slots -1), beside a plain penalised sequence in the same step; the penalty
// slot then counts exactly the accepted tokens. Each position is run twice before it is
// committed: once with drafts mostly wrong, then again over the same uncommitted rows with
// drafts that the first run showed right (rollback: rows of rejected positions are simply
// rewritten). Six penalty slots are set up front, more than the CUDA backend's staging ring
// of uploads holds (a reused staging area must not change an upload still in flight).
TEST_P(BackendTest, VerifyRowsSampleLikePlainDecoding) {
  auto model = Load("dcformer-f32-short-prompt", GetParam());
  ASSERT_TRUE(model.ok());
  Backend& backend = *model->backend;
  ASSERT_TRUE(backend.VerifiesDrafts());
  const int V = model->config.vocab_size;
  constexpr int kDrafts = 4;
  StepLimits limits;
  limits.max_tokens = 24;
  limits.max_seqs = 2;
  limits.max_logit_rows = 24;
  limits.blocks_per_seq = 64;
  limits.num_penalty_slots = 6;
  limits.max_draft_rows = kDrafts;
  absl::StatusOr<KvCacheShape> shape = PrepareWithCache(backend, limits);
  ASSERT_TRUE(shape.ok()) << shape.status();
  KvCacheManager manager(*shape);
  std::vector<PenaltyState> reference(6, PenaltyState(V));
  std::vector<std::vector<int32_t>> prompts(6);
  for (int slot = 0; slot < 6; ++slot) {
    prompts[slot] = {3 + slot, 17 + 2 * slot, 42, 7 + slot * slot};
    ASSERT_TRUE(backend.SetPenaltyState(slot, prompts[slot], {}).ok());
    reference[slot].Reset(prompts[slot], {});
  }
  SamplerScratch scratch;
  // A verifies (slot 5): two candidates, counts that pull the output to repeat itself.
  SamplingRow a;
  a.params.temperature = 1.5f;
  a.params.top_k = 2;
  a.params.repetition_penalty = 1.2f;
  a.params.presence_penalty = -1.0f;
  a.params.frequency_penalty = -0.5f;
  a.seed = 5;
  a.penalty_slot = 5;
  a.logprob = true;
  a.top_logprobs = 3;
  // B decodes plainly (slot 1).
  SamplingRow b = a;
  b.params.top_k = 40;
  b.params.presence_penalty = 0.4f;
  b.seed = 6;
  b.penalty_slot = 1;
  const double tol = GetParam() == BackendKind::kCpu ? 0.0 : 1e-4;
  SequenceKv kv_a, kv_b;
  std::vector<int32_t> feed_a = prompts[5], feed_b = prompts[1];
  std::vector<int32_t> gen_a, gen_b;  // tokens each has generated (committed)
  std::vector<int32_t> wrong = {11, 12, 13, 14};
  int accepted_total = 0, rejected_total = 0;
  StepOutput out;
  for (int step = 0; step < 8; ++step) {
    const bool prefill = step == 0;
    std::vector<int32_t> known;  // true tokens of A's next positions, from the first try
    for (int attempt = 0; attempt < 2; ++attempt) {
      // A's drafts: what the first try showed right, then wrong guesses.
      std::vector<int32_t> drafts = known;
      for (int d = static_cast<int>(drafts.size()); d < kDrafts; ++d) {
        drafts.push_back(wrong[(d + step) % 4]);
      }
      drafts.resize(kDrafts);
      std::vector<int32_t> chunk_a = feed_a;
      const int n = prefill ? 1 : kDrafts + 1;
      if (!prefill) chunk_a.insert(chunk_a.end(), drafts.begin(), drafts.end());
      ASSERT_TRUE(manager.Reserve(kv_a, kv_a.num_tokens + static_cast<int>(chunk_a.size())).ok());
      ASSERT_TRUE(manager.Reserve(kv_b, kv_b.num_tokens + static_cast<int>(feed_b.size())).ok());
      a.step = gen_a.size();  // the draw counter: tokens A sampled before
      StepBatch batch;
      batch.Reset(64);
      batch.AddSequence(chunk_a, kv_a, true, a, /*return_logits=*/true, n);
      b.step = gen_b.size();
      batch.AddSequence(feed_b, kv_b, true, b, /*return_logits=*/true);
      ASSERT_TRUE(backend.Step(batch, &out).ok());
      ASSERT_EQ(out.tokens.size(), static_cast<size_t>(n + 1));
      // A: rows in order against the host, with the drafts before each in its penalties.
      PenaltyState state = reference[5];
      int accepted = 0;
      std::vector<int32_t> sampled;
      for (int j = 0; j < n; ++j) {
        const size_t row = chunk_a.size() - n + j;
        const auto logits = absl::MakeConstSpan(out.logits).subspan(row * V, V);
        const int32_t want = SampleToken(logits, a.params, a.seed, a.step + j, &state, &scratch);
        ASSERT_EQ(out.tokens[j], want) << "step " << step << " try " << attempt << " row " << j;
        std::vector<TopLogprob> top;
        EXPECT_NEAR(out.logprobs[j], ComputeLogprobs(logits, want, 3, &top), tol);
        for (int k = 0; k < 3; ++k)
          EXPECT_EQ(out.top_tokens[j * kMaxTopLogprobs + k], top[k].token);
        state.Record(want);
        sampled.push_back(want);
        if (j + 1 < n && want != drafts[j]) break;
        if (j + 1 < n) ++accepted;
      }
      for (int j = static_cast<int>(sampled.size()); j < n; ++j) {
        EXPECT_EQ(out.tokens[j], -1) << "a row after the first mismatch";
        EXPECT_EQ(out.nonfinite[j], 0);
      }
      EXPECT_EQ(AcceptedDrafts(batch, 0, out, 0), accepted);
      // B: one plain row.
      const auto logits_b =
          absl::MakeConstSpan(out.logits).subspan((chunk_a.size() + feed_b.size() - 1) * V, V);
      const int32_t want_b =
          SampleToken(logits_b, b.params, b.seed, gen_b.size(), &reference[1], &scratch);
      ASSERT_EQ(out.tokens[n], want_b) << "step " << step;
      if (attempt == 0 && !prefill) {
        // Not committed: the second try recomputes these positions with better drafts. The
        // device slots recorded this try's tokens, so put them back as they were.
        manager.ReleaseUncommitted(kv_a);
        manager.ReleaseUncommitted(kv_b);
        ASSERT_TRUE(backend.SetPenaltyState(5, prompts[5], gen_a).ok());
        ASSERT_TRUE(backend.SetPenaltyState(1, prompts[1], gen_b).ok());
        known = sampled;  // every token sampled up to the mismatch is the true one
        continue;
      }
      rejected_total += n > 1 && accepted < n - 1;
      accepted_total += accepted;
      manager.Commit(kv_a, kv_a.num_tokens + static_cast<int>(chunk_a.size()) - (n - 1) + accepted);
      manager.Commit(kv_b, kv_b.num_tokens + static_cast<int>(feed_b.size()));
      manager.ReleaseUncommitted(kv_a);
      for (int32_t t : sampled) reference[5].Record(t);
      reference[1].Record(want_b);
      gen_a.insert(gen_a.end(), sampled.begin(), sampled.end());
      gen_b.push_back(want_b);
      feed_a = {sampled.back()};
      feed_b = {want_b};
      break;
    }
  }
  EXPECT_GT(accepted_total, 0) << "no draft was ever accepted";
  EXPECT_GT(rejected_total, 0) << "no draft was ever rejected";
  manager.Free(kv_a);
  manager.Free(kv_b);
}

}  // namespace
}  // namespace dcf::conformance_test
