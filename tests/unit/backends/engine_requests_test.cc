// Engine tests on the small golden models (CPU; some also on cuda-sim, the CUDA backend's
// kernels on the SIMT emulator, in float32), one binary (backends_engine_test) of several
// files, helpers in engine_test_util.h. The reference for every greedy output is
// SequenceRunner::Greedy on the same backend: one request, alone. They live with the backends'
// tests because they name concrete backends, which serving never does (tests/unit/serving
// runs on fakes).
//
// This file: one request's life: resolved limits, cancellation and dropped handles,
// admission control, invalid requests, stop ids, EOS and stop strings, seeded sampling alone
// and batched, undecodable ids, duplicate client ids.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "engine/serving/engine.h"
#include "engine/serving/engine_setup.h"
#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/testing/tiny_tokenizer.h"
#include "tests/unit/backends/engine_test_util.h"

namespace dcf::engine_test {
namespace {

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
  EXPECT_EQ(l.DefaultMaxNewTokens(252), 4);  // the context left after the prompt
  EXPECT_EQ(l.DefaultMaxNewTokens(256), 1);  // never below 1 (the validator rejects it)
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
  engine.reset();                // shuts down: the request is cancelled
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

// EnqueueAll queues a group whole or not at all: a group that can never wait together is
// OutOfRange (even on an idle engine), one with a bad member names its index, and one the
// queue has no room for now is ResourceExhausted with none of its members queued, where
// one-by-one Enqueue calls would have queued the first and refused the rest.
TEST(EngineTest, EnqueueAllQueuesAGroupWholeOrNotAtAll) {
  EngineOptions o;
  o.max_num_seqs = 1;
  o.max_queued_requests = 3;
  o.max_queued_prompt_tokens = 50;
  o.kv_num_blocks = {8, 8};
  auto engine = MakeEngine(o);
  const auto group = [](std::initializer_list<int> lens, uint32_t seed) {
    std::vector<GenerationRequest> g;
    for (int len : lens) g.push_back(Greedy(RandomPrompt(len, seed++), 10));
    return g;
  };
  int failed = 7;
  auto four = engine->EnqueueAll(group({1, 1, 1, 1}, 1), &failed);
  EXPECT_EQ(four.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(four.status().message(),
            "requests: 4 requests exceed the waiting queue's limit of 3 requests "
            "(max_queued_requests): they can never be queued together");
  EXPECT_EQ(failed, -1);
  auto tokens = engine->EnqueueAll(group({30, 21}, 1), &failed);
  EXPECT_EQ(tokens.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(tokens.status().message(),
            "requests: 2 requests of 51 prompt tokens in all exceed the waiting queue's limit "
            "of 50 prompt tokens (max_queued_prompt_tokens): they can never be queued together");
  EXPECT_EQ(failed, -1);
  // One prompt alone over the bound is that prompt's refusal, as Enqueue gives it.
  auto alone = engine->EnqueueAll(group({2, 51}, 1), &failed);
  EXPECT_EQ(alone.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(failed, 1);
  EXPECT_NE(alone.status().message().find("this prompt can never be queued"),
            absl::string_view::npos);
  // CheckQueueable answers the same without queueing anything.
  const std::vector<GenerationRequest> g4 = group({1, 1, 1, 1}, 1);
  EXPECT_EQ(engine->CheckQueueable(g4, &failed).message(), four.status().message());
  EXPECT_EQ(failed, -1);
  EXPECT_TRUE(engine->CheckQueueable(group({25, 25}, 1)).ok());
  std::vector<GenerationRequest> bad = group({2, 2, 2}, 1);
  bad[2].prompt_tokens.clear();
  auto invalid = engine->EnqueueAll(std::move(bad), &failed);
  EXPECT_EQ(invalid.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(failed, 2);
  // The first request with a refusal of its own is the one named, whichever check it fails.
  std::vector<GenerationRequest> first = group({51, 2}, 1);
  first[1].prompt_tokens.clear();
  EXPECT_EQ(engine->EnqueueAll(std::move(first), &failed).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(engine->Stats().num_waiting, 0);

  auto running = engine->Enqueue(Greedy(RandomPrompt(10, 9), 100));
  ASSERT_TRUE(running.ok());
  Collected c;
  c.TakeOne(running->stream());  // running: the queue is empty again
  auto two = engine->EnqueueAll(group({10, 10}, 11), &failed);
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_EQ(two->size(), 2u);
  EXPECT_NE((*two)[0].stream().key(), (*two)[1].stream().key());
  EXPECT_EQ(engine->Stats().num_waiting, 2);
  // Room for one more request, not two: neither waits.
  auto more = engine->EnqueueAll(group({1, 1}, 13), &failed);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(more.status().message(),
            "the waiting queue is full (2 requests waiting, limit 3; this group needs room for "
            "2); retry later");
  EXPECT_EQ(failed, -1);
  EXPECT_EQ(engine->Stats().num_waiting, 2);
  // Room for 30 prompt tokens, not 31.
  auto heavy = engine->EnqueueAll(group({31}, 15), &failed);
  EXPECT_EQ(heavy.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(heavy.status().message(),
            "the waiting queue is full (20 prompt tokens waiting, limit 50; this one has 31); "
            "retry later");
  EXPECT_EQ(engine->Stats().num_waiting, 2);
  auto last = engine->EnqueueAll(group({30}, 15), &failed);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(engine->Stats().num_waiting, 3);
}

// Every request waits in the queue before it runs, so a queue limit of 0 is refused at
// creation (the server's flags already required >= 1), not by every request after it.
TEST(EngineTest, QueueLimitsOfZeroAreRefused) {
  EngineOptions o;
  EXPECT_TRUE(engine_internal::ValidateEngineOptions(o).ok());
  o.max_queued_requests = 0;
  EXPECT_EQ(engine_internal::ValidateEngineOptions(o).message(), "queue limits must be >= 1");
  o.max_queued_requests = 1;
  o.max_queued_prompt_tokens = 0;
  EXPECT_EQ(engine_internal::ValidateEngineOptions(o).message(), "queue limits must be >= 1");
  o.max_queued_prompt_tokens = 1;
  EXPECT_TRUE(engine_internal::ValidateEngineOptions(o).ok());
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

}  // namespace
}  // namespace dcf::engine_test
