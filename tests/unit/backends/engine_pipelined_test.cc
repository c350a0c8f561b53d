// Engine tests on the small golden models (CPU; some also on cuda-sim, the CUDA backend's
// kernels on the SIMT emulator, in float32), one binary (backends_engine_test) of several
// files, helpers in engine_test_util.h. The reference for every greedy output is
// SequenceRunner::Greedy on the same backend: one request, alone. They live with the backends'
// tests because they name concrete backends, which serving never does (tests/unit/serving
// runs on fakes).
//
// This file: pipelined steps (EngineOptions::pipeline_steps): how the mode resolves per
// backend, and pipelined runs against one step at a time (stops, sampling, speculation,
// prefix caching).
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "engine/serving/engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/testing/forwarding_backend.h"
#include "tests/testing/tiny_tokenizer.h"
#include "tests/unit/backends/engine_test_util.h"

namespace dcf::engine_test {
namespace {

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
  if (kHaveCudaSim) {
    EXPECT_EQ(mode(LoadBackend(BackendKind::kCudaSim), PipelineSteps::kAuto), PipelineSteps::kOn);
    EXPECT_EQ(mode(LoadBackend(BackendKind::kCudaSim), PipelineSteps::kOff), PipelineSteps::kOff);
  } else {
    std::cout << "[ SKIPPED  ] the two cuda-sim engines: this build has no cuda-sim "
                 "(DCFORMER_ENGINE_TEST_CUDA_SIM=OFF)\n";
  }
  EXPECT_EQ(mode(std::make_unique<NonChainingBackend>(LoadBackend()), PipelineSteps::kOn),
            PipelineSteps::kOff);
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

}  // namespace
}  // namespace dcf::engine_test
