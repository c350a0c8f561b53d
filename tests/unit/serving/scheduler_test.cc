// Scheduler tests without a model: a fake step "samples" a deterministic token per sequence.
#include "engine/serving/scheduler.h"

#include <algorithm>
#include <map>
#include <memory>
#include <random>

#include "gtest/gtest.h"
#include "tests/testing/kv_shape.h"

namespace dcf {
namespace {

constexpr LayerGroup kG = LayerGroup::kGlobal;
constexpr LayerGroup kW = LayerGroup::kWindow;

using testing::Shape;

int32_t FakeToken(int64_t seq_id, int pos) { return static_cast<int32_t>((seq_id * 31 + pos) % 97); }

struct Harness {
  Harness(const KvCacheShape& shape, const SchedulerConfig& config, bool prefix_caching = false)
      : kv(shape, prefix_caching), sched(config, &kv) {}

  Sequence* Add(int prompt_len, int max_new) {
    auto s = std::make_unique<Sequence>();
    s->seq_id = static_cast<int64_t>(seqs.size());
    for (int i = 0; i < prompt_len; ++i) s->tokens.push_back(i % 50);
    s->prompt_len = prompt_len;
    s->max_len = prompt_len + max_new;
    sched.Add(s.get());
    seqs.push_back(std::move(s));
    return seqs.back().get();
  }

  // Runs one step; returns its plan (pointers stay valid: sequences are never destroyed).
  SchedulerOutput Step() {
    SchedulerOutput out = sched.Schedule();
    EXPECT_LE(out.num_tokens, sched.config().max_num_batched_tokens);
    sched.Commit(out);
    last_cached.clear();
    for (size_t i = 0; i < out.admitted.size(); ++i) {
      last_cached[out.admitted[i]] = out.cached_tokens[i];
    }
    for (const ScheduledChunk& c : out.chunks) {
      EXPECT_LE(c.num_tokens, sched.config().max_prefill_chunk);
      if (!c.samples) continue;
      Sequence* s = c.seq;
      s->tokens.push_back(FakeToken(s->seq_id, static_cast<int>(s->tokens.size())));
      if (static_cast<int>(s->tokens.size()) == s->max_len) {
        sched.Remove(s);
        SetState(*s, RequestState::kFinished);
      }
    }
    for (const Sequence* s : sched.running()) {
      if (kv.shape().window > 0) {
        EXPECT_LE(s->kv.HeldBlocks(kW), kv.WindowBlockBound());
      }
    }
    return out;
  }

  void RunToCompletion(int max_steps = 10000) {
    for (int i = 0; i < max_steps && sched.HasWork(); ++i) Step();
    ASSERT_FALSE(sched.HasWork());
  }

  KvCacheManager kv;
  Scheduler sched;
  std::vector<std::unique_ptr<Sequence>> seqs;
  std::map<const Sequence*, int> last_cached;  // admitted in the last step -> its hit
};

TEST(SchedulerTest, CompletesEverythingAndFreesEveryBlock) {
  Harness h(Shape(64, 64, 8), {/*max_num_seqs=*/4, /*max_num_batched_tokens=*/16, 0, 0.01});
  for (int i = 0; i < 7; ++i) h.Add(3 + 5 * i, 10 + i);
  h.RunToCompletion();
  for (const auto& s : h.seqs) {
    EXPECT_EQ(s->state, RequestState::kFinished);
    EXPECT_EQ(static_cast<int>(s->tokens.size()), s->max_len);
    for (int p = s->prompt_len; p < s->max_len; ++p) EXPECT_EQ(s->tokens[p], FakeToken(s->seq_id, p));
  }
  EXPECT_EQ(h.kv.num_used(kG), 0);
  EXPECT_EQ(h.kv.num_used(kW), 0);
  EXPECT_EQ(h.sched.num_preemptions(), 0);
}

TEST(SchedulerTest, LongPromptNeverStallsDecodingSequences) {
  Harness h(Shape(256, 64, 8), {4, /*max_num_batched_tokens=*/8, 0, 0.0});
  Sequence* a = h.Add(4, 100);
  Sequence* b = h.Add(3, 100);
  h.Step();  // both prefill in one step (7 tokens)
  ASSERT_EQ(a->state, RequestState::kDecode);
  ASSERT_EQ(b->state, RequestState::kDecode);
  Sequence* big = h.Add(200, 4);
  int prefill_steps = 0;
  while (big->state != RequestState::kDecode) {
    const SchedulerOutput out = h.Step();
    ++prefill_steps;
    int decodes = 0;
    for (const auto& c : out.chunks) {
      if (c.seq == a || c.seq == b) {
        EXPECT_EQ(c.num_tokens, 1);
        ++decodes;
      }
      if (c.seq == big) {
        EXPECT_LE(c.num_tokens, 6);  // the budget left after 2 decodes
      }
    }
    EXPECT_EQ(decodes, 2) << "a decoding sequence was stalled";
    ASSERT_LT(prefill_steps, 100);
  }
  EXPECT_GE(prefill_steps, 200 / 6);
}

TEST(SchedulerTest, PrefillChunkCapIsRespected) {
  Harness h(Shape(256, 64, 8), {4, 64, /*max_prefill_chunk=*/7, 0.0});
  Sequence* s = h.Add(30, 2);
  const SchedulerOutput out = h.Step();
  ASSERT_EQ(out.chunks.size(), 1u);
  EXPECT_EQ(out.chunks[0].num_tokens, 7);
  EXPECT_FALSE(out.chunks[0].samples);
  EXPECT_EQ(s->state, RequestState::kPrefill);
  h.RunToCompletion();
}

TEST(SchedulerTest, PreemptsNewestByRecomputeWhenBlocksRunOut) {
  // 11 global blocks of 4 tokens; three sequences growing to 16 tokens (4 blocks) each.
  Harness h(Shape(11, 32, 0), {8, 64, 0, 0.0});
  Sequence* s0 = h.Add(4, 12);
  Sequence* s1 = h.Add(4, 12);
  Sequence* s2 = h.Add(4, 12);
  bool saw_preempted = false;
  for (int step = 0; step < 1000 && h.sched.HasWork(); ++step) {
    const SchedulerOutput out = h.Step();
    for (const Sequence* p : out.preempted) {
      saw_preempted = true;
      EXPECT_EQ(p, s2) << "the most recently admitted sequence is preempted first";
      EXPECT_EQ(p->state, RequestState::kPreempted);
      EXPECT_EQ(p->kv.num_tokens, 0);
      EXPECT_EQ(h.sched.waiting().front(), p);
    }
  }
  EXPECT_TRUE(saw_preempted);
  EXPECT_GT(h.sched.num_preemptions(), 0);
  for (const Sequence* s : {s0, s1, s2}) {
    EXPECT_EQ(s->state, RequestState::kFinished);
    // Tokens generated before the preemption were kept, not re-sampled.
    for (int p = s->prompt_len; p < s->max_len; ++p) EXPECT_EQ(s->tokens[p], FakeToken(s->seq_id, p));
  }
  EXPECT_EQ(h.kv.num_used(kG), 0);
}

TEST(SchedulerTest, RecomputeFeedsPromptAndGeneratedTokens) {
  Harness h(Shape(4, 32, 0), {8, 64, 0, 0.0});
  Sequence* s0 = h.Add(4, 8);  // positions up to 10: 3 blocks
  Sequence* s1 = h.Add(4, 8);
  int preempted_len = -1;
  bool recomputed = false;
  for (int step = 0; step < 100 && h.sched.HasWork(); ++step) {
    const SchedulerOutput out = h.Step();
    for (const Sequence* p : out.preempted) {
      EXPECT_EQ(p, s1);
      preempted_len = static_cast<int>(p->tokens.size());
      EXPECT_GT(preempted_len, p->prompt_len);  // it had generated tokens
    }
    for (const ScheduledChunk& c : out.chunks) {
      if (c.seq == s1 && preempted_len > 0 && !recomputed) {
        recomputed = true;
        EXPECT_EQ(c.start, 0);
        EXPECT_EQ(c.num_tokens, preempted_len);  // prompt + generated, in one chunk
        EXPECT_TRUE(c.samples);
      }
    }
  }
  EXPECT_TRUE(recomputed);
  EXPECT_EQ(s0->state, RequestState::kFinished);
  EXPECT_EQ(s1->state, RequestState::kFinished);
  EXPECT_EQ(s1->num_preemptions, 1);
}

TEST(SchedulerTest, AdmissionIsFirstComeFirstServed) {
  Harness h(Shape(8, 32, 0), {8, 64, 0, 0.0});
  Sequence* a = h.Add(20, 4);  // 6 blocks at the end
  h.Step();
  Sequence* big = h.Add(16, 4);  // needs 5 blocks: does not fit while a runs
  Sequence* small = h.Add(1, 1);  // would fit, but must not overtake big
  h.Step();
  EXPECT_EQ(big->state, RequestState::kQueued);
  EXPECT_EQ(small->state, RequestState::kQueued);
  h.RunToCompletion();
  EXPECT_EQ(a->state, RequestState::kFinished);
  EXPECT_EQ(big->state, RequestState::kFinished);
  EXPECT_EQ(small->state, RequestState::kFinished);
}

TEST(SchedulerTest, RemoveFreesBlocksInAnyState) {
  Harness h(Shape(32, 32, 8), {1, 64, 0, 0.0});
  Sequence* running = h.Add(10, 50);
  Sequence* queued = h.Add(10, 50);
  h.Step();
  EXPECT_EQ(running->state, RequestState::kDecode);
  EXPECT_EQ(queued->state, RequestState::kQueued);  // max_num_seqs = 1
  EXPECT_GT(h.kv.num_used(kG), 0);
  h.sched.Remove(queued);
  SetState(*queued, RequestState::kCancelled);
  h.sched.Remove(running);
  SetState(*running, RequestState::kCancelled);
  EXPECT_FALSE(h.sched.HasWork());
  EXPECT_EQ(h.kv.num_used(kG), 0);
  EXPECT_EQ(h.kv.num_used(kW), 0);
}

TEST(SchedulerTest, RemovePreemptedSequence) {
  Harness h(Shape(4, 32, 0), {8, 64, 0, 0.0});
  h.Add(4, 8);
  Sequence* s1 = h.Add(4, 8);
  for (int step = 0; step < 100 && s1->state != RequestState::kPreempted; ++step) h.Step();
  ASSERT_EQ(s1->state, RequestState::kPreempted);
  h.sched.Remove(s1);
  SetState(*s1, RequestState::kCancelled);
  EXPECT_EQ(h.sched.num_waiting(), 0);
  h.RunToCompletion();
  EXPECT_EQ(h.kv.num_used(kG), 0);
}

TEST(SchedulerTest, WatermarkHoldsBackAdmission) {
  // 10 blocks, watermark 20% = 2 blocks.
  Harness h(Shape(10, 32, 0), {8, 64, 0, 0.2});
  h.Add(16, 4);  // 4 blocks now (5 at the end)
  h.Step();
  Sequence* b = h.Add(13, 1);  // needs 4 (+1 outstanding for a, +2 watermark) > 6 free
  h.Step();
  EXPECT_EQ(b->state, RequestState::kQueued);
  h.RunToCompletion();
  EXPECT_EQ(b->state, RequestState::kFinished);
}

TEST(SchedulerTest, ChunkTakesTheLargestFit) {
  Harness h(Shape(3, 3, 0), {4, 64, 0, 0.0});  // 12 tokens of blocks
  Sequence* s = h.Add(20, 1);
  const SchedulerOutput out = h.sched.Schedule();
  ASSERT_EQ(out.chunks.size(), 1u);
  EXPECT_EQ(out.chunks[0].num_tokens, 12);  // halving from 20 would have stopped at 10
  h.sched.Remove(s);
}


// --- Prefix caching ---

TEST(SchedulerPrefixTest, AHitStartsPrefillAfterItAndCostsNoBudget) {
  Harness h(Shape(64, 64, /*window=*/6), {4, /*max_num_batched_tokens=*/8, 0, 0.0}, true);
  Sequence* a = h.Add(30, 2);  // tokens i % 50: every prompt of this harness shares them
  h.RunToCompletion();
  ASSERT_EQ(a->state, RequestState::kFinished);
  EXPECT_EQ(h.kv.num_used(kG), 0);
  EXPECT_GT(h.kv.num_cached(kG), 0);
  Sequence* b = h.Add(34, 2);
  const SchedulerOutput out = h.Step();
  ASSERT_EQ(out.chunks.size(), 1u);
  // 30 shared tokens: 7 full blocks of 4; the window needs [23, 28): cached.
  EXPECT_EQ(h.last_cached[b], 28);
  EXPECT_EQ(out.chunks[0].start, 28);
  EXPECT_EQ(out.chunks[0].num_tokens, 6);  // the rest of the prompt, within the budget of 8
  EXPECT_TRUE(out.chunks[0].samples);
  h.RunToCompletion();
  EXPECT_EQ(h.kv.num_used(kG), 0);
  EXPECT_EQ(h.kv.num_used(kW), 0);
}

TEST(SchedulerPrefixTest, WithoutCachingNothingIsReused) {
  Harness h(Shape(64, 64, 6), {4, 8, 0, 0.0});
  h.Add(30, 2);
  h.RunToCompletion();
  Sequence* b = h.Add(34, 2);
  const SchedulerOutput out = h.Step();
  EXPECT_EQ(h.last_cached[b], 0);
  EXPECT_EQ(out.chunks[0].start, 0);
  EXPECT_EQ(h.kv.num_cached(kG), 0);
}

TEST(SchedulerPrefixTest, RecomputeAfterPreemptionReusesWhatIsStillCached) {
  // As RecomputeFeedsPromptAndGeneratedTokens: s1 is preempted once the pool runs out.
  Harness h(Shape(5, 32, 0), {8, 64, 0, 0.0}, true);
  h.Add(9, 8);
  Sequence* s1 = h.Add(9, 8);  // the same 9 prompt tokens
  int readmitted_at = -1;
  for (int step = 0; step < 100 && h.sched.HasWork(); ++step) {
    h.Step();
    if (s1->num_preemptions > 0 && readmitted_at < 0 && h.last_cached.count(s1) != 0) {
      readmitted_at = h.last_cached[s1];
    }
  }
  ASSERT_EQ(s1->num_preemptions, 1);
  // Its blocks went back to the cache when it was preempted; its readmission took back at
  // least the prompt blocks its twin s0 holds (2 full blocks of 4).
  EXPECT_GE(readmitted_at, 8);
  EXPECT_EQ(s1->state, RequestState::kFinished);
  EXPECT_EQ(h.kv.num_used(kG), 0);
}

TEST(SchedulerPrefixTest, CachedButFreeBlocksCountAsFree) {
  Harness h(Shape(8, 32, 0), {8, 64, 0, 0.0}, true);
  h.Add(28, 4);  // 8 blocks at the end, the whole pool: 7 full ones cached when it is done
  h.RunToCompletion();
  EXPECT_EQ(h.kv.num_free(kG), 8);
  EXPECT_EQ(h.kv.num_cached(kG), 7);
  // An unrelated prompt of the same size is admitted at once and evicts them.
  auto s = std::make_unique<Sequence>();
  s->seq_id = 99;
  for (int i = 0; i < 28; ++i) s->tokens.push_back(60 + i % 30);
  s->prompt_len = 28;
  s->max_len = 32;
  h.sched.Add(s.get());
  const SchedulerOutput out = h.Step();
  ASSERT_EQ(out.admitted.size(), 1u);
  EXPECT_EQ(h.last_cached[s.get()], 0);
  h.RunToCompletion();
  EXPECT_EQ(s->state, RequestState::kFinished);
  EXPECT_EQ(h.kv.num_evictions(kG), 7);  // it needed all 8 blocks
  EXPECT_EQ(h.kv.num_used(kG), 0);
}

}  // namespace
}  // namespace dcf

namespace dcf {
namespace {

// The step token budget of the drafts (max_draft_step_tokens, the memory-bound budget):
// three decoding sequences with 4-token drafts get drafts, oldest first, only until the step
// holds that many tokens; 0 leaves only the other limits.
TEST(SchedulerSpecTest, DraftsFillAStepOnlyUpToTheStepTokenBudget) {
  for (const int step_tokens : {0, 1, 3, 4, 5, 9, 16}) {
    SchedulerConfig config{4, 16, 0, 0.0, /*max_draft_tokens=*/12, step_tokens};
    Harness h(Shape(64, 64, 8), config);
    for (int i = 0; i < 3; ++i) h.Add(4, 30);
    for (int i = 0; i < 10 && h.Step().num_prefill_tokens > 0; ++i) {
    }
    ASSERT_EQ(h.sched.running().size(), 3u);
    for (Sequence* s : h.sched.running()) {
      ASSERT_EQ(s->state, RequestState::kDecode);
      s->draft.assign(4, 1);
    }
    const SchedulerOutput out = h.sched.Schedule();
    const int want = step_tokens == 0 ? 12 : std::clamp(step_tokens - 3, 0, 12);
    EXPECT_EQ(out.num_draft_tokens, want) << "budget " << step_tokens;
    EXPECT_EQ(out.num_tokens, 3 + want) << "budget " << step_tokens;
    ASSERT_EQ(out.chunks.size(), 3u);
    EXPECT_EQ(out.chunks[0].num_draft, std::min(4, want)) << "oldest first";
    h.sched.Commit(out, std::vector<int>(out.chunks.size(), 0));
  }
}

// Speculative decoding's bookkeeping, randomized: decoding sequences carry drafts that are
// partly right (FakeToken's future) and partly wrong; a fake verify accepts the right prefix
// plus one sampled token. Every sequence must end with exactly the tokens plain decoding
// gives, no step may exceed the budget or the draft cap, rejected positions must leave no
// block behind (after Commit a sequence holds only the blocks of its committed positions),
// and the pool must be whole at the end, with and without prefix caching and a window.
TEST(SchedulerSpecTest, RandomDraftsKeepTokensAndBlocksExact) {
  std::mt19937 rng(7);
  for (bool cached : {false, true}) {
    for (int trial = 0; trial < 20; ++trial) {
      const int B = 1 + static_cast<int>(rng() % 6);
      KvCacheShape shape = Shape(40 + static_cast<int>(rng() % 80), 40, /*window=*/8, B);
      // A step token budget above max_num_seqs (else some trials could never draft).
      SchedulerConfig config{4, 16, 0, 0.0, 1 + static_cast<int>(rng() % 10),
                             rng() % 3 == 0 ? 0 : 5 + static_cast<int>(rng() % 12)};
      Harness h(shape, config, cached);
      for (int i = 0; i < 6; ++i) h.Add(2 + static_cast<int>(rng() % 12), 4 + static_cast<int>(rng() % 20));
      int drafted = 0, accepted_total = 0;
      for (int step = 0; step < 2000 && h.sched.HasWork(); ++step) {
        for (Sequence* s : h.sched.running()) {
          s->draft.clear();
          if (s->state != RequestState::kDecode) continue;
          const int room = s->max_len - static_cast<int>(s->tokens.size()) - 1;
          const int n = std::min(room, static_cast<int>(rng() % 6));  // up to window - 2
          const int wrong_at = static_cast<int>(rng() % 8);
          for (int j = 0; j < n; ++j) {
            const int pos = static_cast<int>(s->tokens.size()) + j;
            s->draft.push_back(j == wrong_at ? 98 : FakeToken(s->seq_id, pos));
          }
        }
        SchedulerOutput out = h.sched.Schedule();
        ASSERT_LE(out.num_tokens, config.max_num_batched_tokens);
        ASSERT_LE(out.num_draft_tokens, config.max_draft_tokens);
        if (out.num_draft_tokens > 0 && config.max_draft_step_tokens > 0) {
          ASSERT_LE(out.num_tokens, config.max_draft_step_tokens);
        }
        std::vector<int> accepted(out.chunks.size(), 0);
        for (size_t i = 0; i < out.chunks.size(); ++i) {
          const ScheduledChunk& c = out.chunks[i];
          if (c.num_draft == 0) continue;
          Sequence* s = c.seq;
          ASSERT_EQ(c.num_tokens, c.num_draft + 1);
          int a = 0;
          while (a < c.num_draft &&
                 s->draft[a] == FakeToken(s->seq_id, static_cast<int>(s->tokens.size()) + a)) {
            ++a;
          }
          accepted[i] = a;
          drafted += c.num_draft;
          accepted_total += a;
          s->tokens.insert(s->tokens.end(), s->draft.begin(), s->draft.begin() + a);
        }
        h.sched.Commit(out, accepted);
        for (const ScheduledChunk& c : out.chunks) {
          if (!c.samples) continue;
          Sequence* s = c.seq;
          s->tokens.push_back(FakeToken(s->seq_id, static_cast<int>(s->tokens.size())));
          ASSERT_LE(static_cast<int>(s->tokens.size()), s->max_len);
          if (static_cast<int>(s->tokens.size()) == s->max_len) {
            h.sched.Remove(s);
            SetState(*s, RequestState::kFinished);
          }
        }
        for (const Sequence* s : h.sched.running()) {
          const int committed_blocks = (s->kv.num_tokens + B - 1) / B;
          ASSERT_LE(static_cast<int>(s->kv.blocks[0].size()), committed_blocks);
          ASSERT_LE(s->kv.HeldBlocks(kW), h.kv.WindowBlockBound());
        }
      }
      ASSERT_FALSE(h.sched.HasWork());
      for (const auto& s : h.seqs) {
        for (int p = s->prompt_len; p < s->max_len; ++p) {
          ASSERT_EQ(s->tokens[p], FakeToken(s->seq_id, p)) << "seq " << s->seq_id << " pos " << p;
        }
      }
      EXPECT_EQ(h.kv.num_used(kG), 0);
      EXPECT_EQ(h.kv.num_used(kW), 0);
      EXPECT_GT(drafted, 0);
      EXPECT_GT(accepted_total, 0);
    }
  }
}

// Pipelined steps' bookkeeping (the engine's order, engine_loop.cc Chain), randomized: each
// step is planned while the previous one's tokens are still pending (kPendingToken in
// Sequence::tokens); its sampling chunks add pending tokens, then the previous step's tokens
// are filled (a sequence whose token reaches max_len, or a random "stop" token, ends there and
// its chunk of this step is dropped), and only then is this step committed. Every sequence
// must end with exactly the tokens of plain decoding, a pending token is only ever scheduled
// as the one token of a decode chunk, never past max_len, never hashed (KvCacheManager aborts
// on that) and never admitted (Schedule aborts on that; the engine's order, kept here, never
// does it: sequences preempted with a pending token get it before the next Schedule), and the
// pool must be whole at the end; with and without prefix
// caching (a shared prompt prefix gives hits), a window, and pools small enough to preempt.
TEST(SchedulerPipelineTest, PendingTokensKeepTokensAndBlocksExact) {
  std::mt19937 rng(11);
  int preempted_pending = 0, skipped_at_length = 0, ended_in_flight = 0, hits = 0;
  for (bool cached : {false, true}) {
    for (int trial = 0; trial < 40; ++trial) {
      const int B = 1 + static_cast<int>(rng() % 6);
      // At least what the longest sequence (34 tokens) needs alone (Enqueue's rule).
      const int fits = (34 + B - 1) / B;
      const KvCacheShape shape = Shape(fits + static_cast<int>(rng() % 40), 40, /*window=*/8, B);
      const SchedulerConfig config{1 + static_cast<int>(rng() % 5),
                                   4 + static_cast<int>(rng() % 16), static_cast<int>(rng() % 8),
                                   0.0};
      Harness h(shape, config, cached);
      std::map<const Sequence*, int> stop_at;  // a sequence "samples a stop token" there
      for (int i = 0; i < 7; ++i) {
        Sequence* s = h.Add(2 + static_cast<int>(rng() % 12), 1 + static_cast<int>(rng() % 20));
        if (rng() % 3 == 0) stop_at[s] = s->prompt_len + static_cast<int>(rng() % 8);
      }
      const auto ended = [&](const Sequence* s, int len) {
        return len == s->max_len || (stop_at.count(s) > 0 && len == stop_at[s] + 1);
      };
      std::vector<Sequence*> previous;  // the sequences the step in flight samples for
      for (int step = 0; step < 2000 && (h.sched.HasWork() || !previous.empty()); ++step) {
        SchedulerOutput out = h.sched.Schedule();
        for (size_t i = 0; i < out.admitted.size(); ++i) hits += out.cached_tokens[i] > 0;
        for (const Sequence* p : out.preempted) preempted_pending += p->num_pending > 0;
        for (const Sequence* s : h.sched.running()) {
          if (s->num_pending > 0 && static_cast<int>(s->tokens.size()) == s->max_len) {
            ++skipped_at_length;
          }
        }
        for (const ScheduledChunk& c : out.chunks) {
          ASSERT_LE(c.start + c.num_tokens, c.seq->max_len);
          // A pending token that is the sequence's last (max_len) ends it: no chunk for it.
          ASSERT_TRUE(c.seq->num_pending == 0 ||
                      static_cast<int>(c.seq->tokens.size()) < c.seq->max_len)
              << "seq " << c.seq->seq_id << " scheduled past its last token";
          if (c.seq->num_pending == 0) continue;
          ASSERT_EQ(c.seq->num_pending, 1);
          ASSERT_EQ(c.num_tokens, 1);
          ASSERT_EQ(c.start + 1, static_cast<int>(c.seq->tokens.size()));
          ASSERT_TRUE(c.samples);
        }
        // Launch: what this step samples is pending.
        std::vector<Sequence*> sampling;
        for (const ScheduledChunk& c : out.chunks) {
          if (!c.samples) continue;
          c.seq->tokens.push_back(kPendingToken);
          ++c.seq->num_pending;
          sampling.push_back(c.seq);
        }
        // The previous step's results: the oldest pending token of each of its sequences.
        std::vector<const Sequence*> dropped;
        for (Sequence* s : previous) {
          const int at = static_cast<int>(s->tokens.size()) - s->num_pending;
          s->tokens[at] = FakeToken(s->seq_id, at);
          --s->num_pending;
          if (ended(s, at + 1)) {
            ++ended_in_flight;
            h.sched.Remove(s);
            s->tokens.resize(s->tokens.size() - s->num_pending);
            s->num_pending = 0;
            SetState(*s, RequestState::kFinished);
            dropped.push_back(s);
          }
        }
        const auto is_dropped = [&](const Sequence* s) {
          return std::find(dropped.begin(), dropped.end(), s) != dropped.end();
        };
        SchedulerOutput committed;
        for (const ScheduledChunk& c : out.chunks) {
          if (!is_dropped(c.seq)) committed.chunks.push_back(c);
        }
        h.sched.Commit(committed);
        previous.clear();
        for (Sequence* s : sampling) {
          if (!is_dropped(s)) previous.push_back(s);
        }
        for (const Sequence* s : h.sched.running()) {
          ASSERT_LE(s->kv.HeldBlocks(kW), h.kv.WindowBlockBound());
        }
      }
      ASSERT_FALSE(h.sched.HasWork());
      ASSERT_TRUE(previous.empty());
      for (const auto& s : h.seqs) {
        ASSERT_EQ(s->state, RequestState::kFinished);
        ASSERT_EQ(s->num_pending, 0);
        const int end =
            stop_at.count(s.get()) > 0 ? std::min(s->max_len, stop_at[s.get()] + 1) : s->max_len;
        ASSERT_EQ(static_cast<int>(s->tokens.size()), end) << "seq " << s->seq_id;
        for (int p = s->prompt_len; p < end; ++p) {
          ASSERT_EQ(s->tokens[p], FakeToken(s->seq_id, p)) << "seq " << s->seq_id << " pos " << p;
        }
      }
      EXPECT_EQ(h.kv.num_used(kG), 0);
      EXPECT_EQ(h.kv.num_used(kW), 0);
    }
  }
  // The generator reaches every case the rules are for.
  EXPECT_GT(preempted_pending, 0);
  EXPECT_GT(skipped_at_length, 0);
  EXPECT_GT(ended_in_flight, 0);
  EXPECT_GT(hits, 0);
}

// Admission needs every token of a sequence (its prefix lookup, its prefill): a waiting
// sequence with a pending token (preempted while a step sampled it, and Schedule called before
// that step's results filled it) aborts, naming the caller's rule it broke.
TEST(SchedulerPipelineDeathTest, AdmittingAPendingTokenAborts) {
  Harness h(Shape(8, 8, /*window=*/8, 4), SchedulerConfig{4, 16, 0, 0.0});
  Sequence* s = h.Add(5, 4);
  s->tokens.push_back(kPendingToken);
  ++s->num_pending;
  EXPECT_DEATH(h.sched.Schedule(), "with a pending token");
}

}  // namespace
}  // namespace dcf
