// Speculative decoding (prompt lookup) against the plain path it replaces, through the
// engine: with speculation on, every token, logprob and top alternative must be what
// speculation off streams. On the CPU bit-identical (its rows are the same whatever the
// chunk, and a verify row is sampled with the draw and penalty state plain decoding uses
// there); on cuda-sim in float32 the same tokens, logprobs and top alternatives within 1e-4
// (a verify chunk's rows go through the chunk's GEMMs, not the decode step's, so they may
// round differently). Greedy and seeded sampling (temperature, top-k/p, min-p, every
// penalty), stop ids, EOS and max_new_tokens falling inside a draft, batches mixing
// speculating and opted-out requests, a pool small enough to force preemption, every golden
// case with prefix caching on and off, and the trained default model with stop strings
// (CPU only). cuda-sim runs a subset of each (it is ~100x slower).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/backends/backend_factory.h"
#include "engine/serving/engine.h"
#include "engine/simt/simt_testing.h"
#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/testing/collected_stream.h"
#include "tests/testing/golden.h"

namespace dcf {
namespace {

using testing::Collected;
using testing::RunToEnd;

std::unique_ptr<Engine> MakeEngine(const std::string& dir, BackendKind kind,
                                   const EngineOptions& options,
                                   const Tokenizer* tokenizer = nullptr) {
  BackendOptions b;
  b.kind = kind;
  if (kind == BackendKind::kCudaSim) b.dtype = DType::kF32;
  auto m = LoadModel(dir, b);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return nullptr;
  auto e = Engine::Create(std::move(m->backend), tokenizer, options);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// `tolerance` < 0: bit-identical logprobs; else within it.
void ExpectSameStream(const Collected& off, const Collected& on, const std::string& what,
                      float tolerance = -1) {
  const auto same = [tolerance](float a, float b) {
    return tolerance < 0 ? Bits(a) == Bits(b) : std::abs(a - b) <= tolerance;
  };
  ASSERT_TRUE(off.finished && on.finished) << what;
  EXPECT_EQ(off.final_chunk.finish_reason, on.final_chunk.finish_reason) << what;
  EXPECT_EQ(off.final_chunk.usage.generated_tokens, on.final_chunk.usage.generated_tokens)
      << what;
  EXPECT_EQ(off.text, on.text) << what;
  ASSERT_EQ(off.ids(), on.ids()) << what;
  for (size_t i = 0; i < off.tokens.size(); ++i) {
    const TokenOutput& a = off.tokens[i];
    const TokenOutput& b = on.tokens[i];
    ASSERT_TRUE(same(a.logprob, b.logprob))
        << what << " token " << i << ": " << a.logprob << " vs " << b.logprob;
    ASSERT_EQ(a.top.size(), b.top.size()) << what << " token " << i;
    for (size_t k = 0; k < a.top.size(); ++k) {
      ASSERT_EQ(a.top[k].token, b.top[k].token) << what << " token " << i << " alt " << k;
      ASSERT_TRUE(same(a.top[k].logprob, b.top[k].logprob))
          << what << " token " << i << " alt " << k;
    }
  }
}

// kNarrow: two candidates, so drafts are accepted often and the draw decides each token (a
// wrong draw counter or penalty state at a verify row shows at once).
enum class Kind { kGreedy, kSeeded, kPenalised, kNarrow, kNarrowPenalised };
const char* KindName(Kind k) {
  switch (k) {
    case Kind::kGreedy: return "greedy";
    case Kind::kSeeded: return "seeded";
    case Kind::kPenalised: return "penalised";
    case Kind::kNarrow: return "narrow";
    case Kind::kNarrowPenalised: return "narrow penalised";
  }
  return "?";
}

GenerationRequest Request(std::vector<int32_t> prompt, int max_new, Kind kind, uint64_t seed) {
  GenerationRequest r;
  r.prompt_tokens = std::move(prompt);
  r.stopping.max_new_tokens = max_new;
  r.output.text = false;
  r.output.logprobs = true;
  r.output.top_logprobs = 5;
  switch (kind) {
    case Kind::kGreedy:
      r.sampling.temperature = 0;
      break;
    case Kind::kSeeded:
      r.sampling.temperature = 0.7f;
      r.sampling.top_k = 40;
      r.sampling.top_p = 0.9f;
      r.sampling.min_p = 0.02f;
      r.sampling.seed = seed;
      break;
    case Kind::kPenalised:
      r.sampling.temperature = 0.9f;
      r.sampling.repetition_penalty = 1.2f;
      r.sampling.presence_penalty = 0.3f;
      r.sampling.frequency_penalty = 0.2f;
      r.sampling.seed = seed;
      break;
    case Kind::kNarrow:
      r.sampling.temperature = 1.5f;
      r.sampling.top_k = 2;
      r.sampling.seed = seed;
      break;
    case Kind::kNarrowPenalised:
      r.sampling.temperature = 1.5f;
      r.sampling.top_k = 2;
      // Negative: the output repeats itself, so drafts are accepted, and each count moves a
      // logit by a lot (a verify row that missed a draft token's count would show).
      r.sampling.presence_penalty = -1.0f;
      r.sampling.frequency_penalty = -0.5f;
      r.sampling.seed = seed;
      break;
  }
  return r;
}

// Copy-heavy prompts (a phrase repeated: the proposer always finds a match, the model
// sometimes follows it) and the golden prompt itself.
std::vector<std::vector<int32_t>> Prompts(const testing::Golden& g, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> out = {g.prompt};
  for (int len : {3, 7, 11}) {
    std::vector<int32_t> phrase;
    for (int i = 0; i < len; ++i) phrase.push_back(static_cast<int32_t>(3 + rng() % 290));
    std::vector<int32_t> p;
    for (int rep = 0; rep < 4; ++rep) p.insert(p.end(), phrase.begin(), phrase.end());
    out.push_back(p);
  }
  return out;
}

EngineOptions SpecOptions(int block_size, bool prefix_caching, int spec_tokens) {
  EngineOptions o;
  o.block_size = block_size;
  o.prefix_caching = prefix_caching;
  o.kv_num_blocks = {256, 256};
  o.spec_tokens = spec_tokens;
  o.spec_step_tokens = o.max_num_batched_tokens;  // not the measured budget: draft always
  o.spec_ngram_min = 1;      // draft as often as possible: rejections are the point
  o.spec_adaptive = false;   // likewise
  return o;
}

// What a backend's verify rows must reproduce of plain decoding: bit-identical logprobs on
// the CPU, within 1e-4 on cuda-sim (float32).
float Tolerance(BackendKind kind) { return kind == BackendKind::kCpu ? -1.0f : 1e-4f; }

std::string BackendName(const ::testing::TestParamInfo<BackendKind>& info) {
  std::string n = BackendKindName(info.param);
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

struct GoldenParam {
  std::string name;
  int block_size;
  bool prefix_caching;
  BackendKind backend = BackendKind::kCpu;
};

std::string GoldenName(const ::testing::TestParamInfo<GoldenParam>& info) {
  std::string n = absl::StrCat(BackendKindName(info.param.backend), "_", info.param.name, "_B",
                               info.param.block_size,
                               info.param.prefix_caching ? "_cached" : "_uncached");
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

class SpecDecodeGoldenTest : public ::testing::TestWithParam<GoldenParam> {};

// One request at a time, then all of them at once with every other one opted out (a batch
// mixing verify chunks, plain decodes and prefills).
TEST_P(SpecDecodeGoldenTest, BitIdenticalWithSpeculationOnAndOff) {
  const GoldenParam& p = GetParam();
  const testing::Golden g = testing::LoadGolden(p.name);
  const std::string dir = testing::GoldenDir(p.name);
  const bool sim = p.backend != BackendKind::kCpu;
  const float tol = Tolerance(p.backend);
  auto off = MakeEngine(dir, p.backend, SpecOptions(p.block_size, p.prefix_caching, 0));
  auto on = MakeEngine(dir, p.backend, SpecOptions(p.block_size, p.prefix_caching, 4));
  ASSERT_TRUE(off != nullptr && on != nullptr);
  EXPECT_EQ(on->Stats().spec_tokens, 4);
  EXPECT_EQ(off->Stats().spec_tokens, 0);
  std::vector<GenerationRequest> requests;
  uint64_t seed = 11;
  // cuda-sim: greedy, seeded and penalised narrow sampling on the golden prompt, greedy and
  // penalised narrow sampling on two copy-heavy prompts.
  const int max_new = sim ? 12 : 24;
  const std::vector<std::vector<int32_t>> prompts = Prompts(g, 7);
  for (size_t pi = 0; pi < prompts.size(); ++pi) {
    for (Kind k : {Kind::kGreedy, Kind::kSeeded, Kind::kPenalised, Kind::kNarrow,
                   Kind::kNarrowPenalised}) {
      const bool keep = !sim || (pi == 0 && k != Kind::kPenalised && k != Kind::kNarrow) ||
                        (pi <= 2 && (k == Kind::kGreedy || k == Kind::kNarrowPenalised));
      if (keep) requests.push_back(Request(prompts[pi], pi == 0 ? 24 : max_new, k, seed));
      ++seed;
    }
  }
  std::vector<Collected> alone_off;
  for (size_t i = 0; i < requests.size(); ++i) {
    const Collected a = RunToEnd(*off, requests[i]);
    const Collected b = RunToEnd(*on, requests[i]);
    ExpectSameStream(a, b, absl::StrCat("request ", i, " alone"), tol);
    if (::testing::Test::HasFatalFailure()) return;
    alone_off.push_back(a);
  }
  const EngineStats alone = on->Stats();
  EXPECT_GT(alone.spec_drafted_tokens, 0);
  EXPECT_GT(alone.spec_accepted_tokens, 0) << "no draft was ever accepted";
  EXPECT_LT(alone.spec_accepted_tokens, alone.spec_drafted_tokens) << "no draft was rejected";
  EXPECT_LT(alone.steps, off->Stats().steps) << "accepted drafts must save steps";
  // The golden prompt's greedy continuation is the reference's.
  EXPECT_EQ(alone_off[0].ids(), std::vector<int32_t>(g.greedy.begin(), g.greedy.begin() + 24));

  std::vector<RequestHandle> handles;
  for (size_t i = 0; i < requests.size(); ++i) {
    GenerationRequest r = requests[i];
    r.speculate = i % 2 == 0;
    auto h = on->Enqueue(std::move(r));
    ASSERT_TRUE(h.ok()) << h.status();
    handles.push_back(std::move(*h));
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    Collected c;
    c.Drain(handles[i].stream());
    ExpectSameStream(alone_off[i], c, absl::StrCat("request ", i, " batched"), tol);
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_GT(on->Stats().spec_drafted_tokens, alone.spec_drafted_tokens);
  EXPECT_EQ(on->Stats().kv_blocks_used[0], 0);
  EXPECT_EQ(on->Stats().kv_blocks_used[1], 0);
}

// The step token budget of the drafts: a budget of one token (a step already holding a
// decode) drafts nothing, and the output is unchanged; the CPU backend's measured budget is
// within [1, what it was asked for], and used when none is given.
TEST(SpecDecodeStepBudgetTest, DraftsOnlyFitTheStepTokenBudget) {
  const std::string name = "dcformer-f32-long-prompt";
  const testing::Golden g = testing::LoadGolden(name);
  const std::string dir = testing::GoldenDir(name);
  EngineOptions o = SpecOptions(16, false, 4);
  o.spec_step_tokens = 1;
  auto one = MakeEngine(dir, BackendKind::kCpu, o);
  auto off = MakeEngine(dir, BackendKind::kCpu, SpecOptions(16, false, 0));
  ASSERT_TRUE(one != nullptr && off != nullptr);
  // A budget of one token leaves no room for a draft: speculation is off altogether.
  EXPECT_EQ(one->Stats().spec_tokens, 0);
  EXPECT_EQ(one->Stats().spec_step_tokens, 0);
  const std::vector<std::vector<int32_t>> prompts = Prompts(g, 3);
  for (const std::vector<int32_t>& prompt : prompts) {
    const GenerationRequest r = Request(prompt, 24, Kind::kGreedy, 5);
    ExpectSameStream(RunToEnd(*off, r), RunToEnd(*one, r), "budget 1");
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_EQ(one->Stats().spec_drafted_tokens, 0);
  // A budget of 2: one sequence alone drafts (one token a step), two together never do (nor
  // propose: the engine skips the proposer), and every stream is the plain one.
  o.spec_step_tokens = 2;
  auto two = MakeEngine(dir, BackendKind::kCpu, o);
  ASSERT_TRUE(two != nullptr);
  EXPECT_EQ(two->Stats().spec_step_tokens, 2);
  std::vector<GenerationRequest> requests;
  std::vector<Collected> plain;
  for (size_t i = 0; i < 2; ++i) {
    requests.push_back(Request(prompts[i], 24, Kind::kGreedy, 5));
    requests.back().stopping.ignore_eos = true;  // both run to 24 tokens, side by side
    plain.push_back(RunToEnd(*off, requests.back()));
    ExpectSameStream(plain.back(), RunToEnd(*two, requests.back()),
                     absl::StrCat("budget 2, request ", i));
    if (::testing::Test::HasFatalFailure()) return;
  }
  const EngineStats alone = two->Stats();
  EXPECT_GT(alone.spec_drafted_tokens, 0);
  EXPECT_LE(alone.spec_drafted_tokens, alone.steps) << "at most one draft a step";
  std::vector<RequestHandle> handles;
  for (size_t i = 0; i < 2; ++i) {
    auto h = two->Enqueue(requests[i]);
    ASSERT_TRUE(h.ok()) << h.status();
    handles.push_back(std::move(*h));
  }
  for (size_t i = 0; i < 2; ++i) {
    Collected c;
    c.Drain(handles[i].stream());
    ExpectSameStream(plain[i], c, absl::StrCat("budget 2, request ", i, " batched"));
    if (::testing::Test::HasFatalFailure()) return;
  }
  // Only a step where one of them runs alone (before the other's admission, after its end:
  // a token or two left) can hold a draft.
  EXPECT_LE(two->Stats().spec_drafted_tokens - alone.spec_drafted_tokens, 2);
  o.spec_step_tokens = 0;  // measured
  auto measured = MakeEngine(dir, BackendKind::kCpu, o);
  ASSERT_TRUE(measured != nullptr);
  const EngineStats st = measured->Stats();
  if (st.spec_tokens == 0) {  // measured 1
    EXPECT_EQ(st.spec_step_tokens, 0);
  } else {
    EXPECT_EQ(st.spec_tokens, 4);
    EXPECT_GE(st.spec_step_tokens, 2);
    EXPECT_LE(st.spec_step_tokens, o.max_num_batched_tokens);
  }
  BackendOptions cpu;
  cpu.kind = BackendKind::kCpu;
  auto m = LoadModel(dir, cpu);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->backend->MeasureMemoryBoundTokens(1), 1);
  const int t = m->backend->MeasureMemoryBoundTokens(16);
  EXPECT_GE(t, 1);
  EXPECT_LE(t, 16);
}

std::vector<GoldenParam> GoldenParams() {
  std::vector<GoldenParam> out;
  for (const std::string& name : testing::GoldenCases()) {
    for (int block_size : {1, 5, 16}) {
      for (bool cached : {false, true}) out.push_back({name, block_size, cached});
    }
    // cuda-sim (about 20 s of CPU each): blocks that a verify chunk crosses, uncached.
    out.push_back({name, 5, false, BackendKind::kCudaSim});
  }
  // And once with prefix caching (window layers then give every position a block).
  out.push_back({"dcformer-f32-long-prompt", 16, true, BackendKind::kCudaSim});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Golden, SpecDecodeGoldenTest, ::testing::ValuesIn(GoldenParams()),
                         GoldenName);

// max_new_tokens, a stop id and an EOS at every position of the first 12 tokens: each falls
// inside an accepted run of some verify (the prompt makes the model copy), and the output
// must end exactly there.
class SpecDecodeStopTest : public ::testing::TestWithParam<BackendKind> {};

TEST_P(SpecDecodeStopTest, StopsInsideADraftCutExactly) {
  const BackendKind backend = GetParam();
  const bool sim = backend != BackendKind::kCpu;
  const std::string name = "dcformer-f32-long-prompt";
  const std::string dir = testing::GoldenDir(name);
  const testing::Golden g = testing::LoadGolden(name);
  auto off = MakeEngine(dir, backend, SpecOptions(5, true, 0));
  auto on = MakeEngine(dir, backend, SpecOptions(5, true, 6));
  ASSERT_TRUE(off != nullptr && on != nullptr);
  std::vector<std::vector<int32_t>> prompts = Prompts(g, 3);
  // cuda-sim: the copy-heavy prompt whose drafts are accepted most (3-token phrase), the
  // first 8 positions.
  if (sim) prompts = {prompts[1]};
  const int positions = sim ? 8 : 12;
  for (const auto& prompt : prompts) {
    for (Kind kind : {Kind::kGreedy, Kind::kPenalised, Kind::kNarrowPenalised}) {
      if (sim && kind == Kind::kPenalised) continue;
      const GenerationRequest base = Request(prompt, 16, kind, 5);
      const Collected full = RunToEnd(*off, base);
      ASSERT_TRUE(full.finished);
      for (int i = 0; i < positions && i < static_cast<int>(full.tokens.size()); ++i) {
        const std::string what = absl::StrCat(KindName(kind), " prompt of ", prompt.size(),
                                              " tokens, stop at ", i);
        GenerationRequest len = base;
        len.stopping.max_new_tokens = i + 1;
        GenerationRequest stop_id = base;
        stop_id.stopping.stop_token_ids = {full.tokens[i].token};
        GenerationRequest eos = base;
        eos.stopping.eos_token_id = full.tokens[i].token;
        for (const GenerationRequest* r : {&len, &stop_id, &eos}) {
          const Collected a = RunToEnd(*off, *r);
          const Collected b = RunToEnd(*on, *r);
          ExpectSameStream(a, b, what, Tolerance(backend));
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
  EXPECT_GT(on->Stats().spec_accepted_tokens, 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, SpecDecodeStopTest,
                         ::testing::Values(BackendKind::kCpu, BackendKind::kCudaSim), BackendName);

// A random stream in overlapping waves into a pool that holds about two requests: verify
// chunks are preempted, readmitted and recomputed, and still stream what plain decoding does.
class SpecDecodeStreamTest : public ::testing::TestWithParam<BackendKind> {};

TEST_P(SpecDecodeStreamTest, UnderPreemptionMatchesSpeculationOff) {
  const BackendKind backend = GetParam();
  const bool sim = backend != BackendKind::kCpu;
  const std::string name = "dcformer-f32-long-prompt";
  const std::string dir = testing::GoldenDir(name);
  const testing::Golden g = testing::LoadGolden(name);
  std::mt19937_64 rng(99);
  std::vector<GenerationRequest> stream;
  const std::vector<std::vector<int32_t>> prompts = Prompts(g, 17);
  for (int i = 0; i < (sim ? 12 : 24); ++i) {
    std::vector<int32_t> prompt = prompts[rng() % prompts.size()];
    prompt.resize(prompt.size() - rng() % 4);
    stream.push_back(Request(prompt, 8 + static_cast<int>(rng() % 24),
                             static_cast<Kind>(i % 3), rng()));
    stream.back().speculate = i % 5 != 4;
  }
  EngineOptions o;
  o.block_size = 5;
  o.max_num_seqs = 6;
  o.max_num_batched_tokens = 24;
  o.kv_num_blocks = {22, 14};
  o.watermark = 0;
  o.spec_ngram_min = 1;
  o.spec_adaptive = false;
  for (bool cached : {false, true}) {
    if (sim && !cached) continue;
    o.prefix_caching = cached;
    EngineOptions o_on = o;
    o_on.spec_tokens = 4;
    o_on.spec_step_tokens = o.max_num_batched_tokens;
    auto off = MakeEngine(dir, backend, o);
    auto on = MakeEngine(dir, backend, o_on);
    ASSERT_TRUE(off != nullptr && on != nullptr);
    const auto run = [&](Engine& e) {
      std::vector<Collected> got(stream.size());
      std::vector<RequestHandle> handles;
      for (size_t i = 0; i < stream.size(); ++i) {
        if (i > 0 && i % 6 == 0) got[i - 6].TakeOne(handles[i - 6].stream());
        auto h = e.Enqueue(stream[i]);
        EXPECT_TRUE(h.ok()) << h.status();
        handles.push_back(std::move(*h));
      }
      for (size_t i = 0; i < stream.size(); ++i) got[i].Drain(handles[i].stream());
      return got;
    };
    const std::vector<Collected> a = run(*off);
    const std::vector<Collected> b = run(*on);
    for (size_t i = 0; i < stream.size(); ++i) {
      ExpectSameStream(a[i], b[i], absl::StrCat(cached ? "cached" : "uncached", " request ", i),
                       Tolerance(backend));
      if (::testing::Test::HasFatalFailure()) return;
    }
    const EngineStats st = on->Stats();
    EXPECT_GT(st.num_preemptions, 0) << "the pool was meant to force preemption";
    EXPECT_GT(st.spec_accepted_tokens, 0);
    EXPECT_EQ(st.kv_blocks_used[0], 0);
    EXPECT_EQ(st.kv_blocks_used[1], 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, SpecDecodeStreamTest,
                         ::testing::Values(BackendKind::kCpu, BackendKind::kCudaSim), BackendName);

// The trained default model with its tokenizer: a passage to repeat, and stop strings taken
// from the plain output's text so that they end inside an accepted run.
TEST(SpecDecodeKjvTest, CopyingPassageWithStopStringsMatchesSpeculationOff) {
  const std::string dir = std::string(DCF_SOURCE_DIR) + "/models/dcformer-kjv";
  auto tok = Tokenizer::FromModelDir(dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EngineOptions o;
  o.kv_num_blocks = {128, 128};
  o.spec_adaptive = false;
  EngineOptions o_on = o;
  o_on.spec_tokens = 5;
  o_on.spec_step_tokens = o.max_num_batched_tokens;
  auto off = MakeEngine(dir, BackendKind::kCpu, o, tok->get());
  auto on = MakeEngine(dir, BackendKind::kCpu, o_on, tok->get());
  ASSERT_TRUE(off != nullptr && on != nullptr);
  const std::string passage =
      "In the beginning God created the heaven and the earth. And the earth was without "
      "form, and void; and darkness was upon the face of the deep.";
  const auto encoded = (*tok)->Encode(passage + " " + passage + " " + passage);
  ASSERT_TRUE(encoded.ok()) << encoded.status();
  const std::vector<int32_t>& prompt = *encoded;
  for (Kind kind : {Kind::kGreedy, Kind::kSeeded, Kind::kPenalised}) {
    GenerationRequest base = Request(prompt, 40, kind, 3);
    base.output.text = true;
    const Collected full = RunToEnd(*off, base);
    ASSERT_TRUE(full.finished);
    ExpectSameStream(full, RunToEnd(*on, base), KindName(kind));
    for (size_t at : {size_t{5}, size_t{17}, full.text.size() / 2}) {
      if (at + 4 > full.text.size()) continue;
      GenerationRequest r = base;
      r.stopping.stop_strings = {full.text.substr(at, 4)};
      for (bool include : {false, true}) {
        r.stopping.include_stop_string = include;
        ExpectSameStream(RunToEnd(*off, r), RunToEnd(*on, r),
                         absl::StrCat(KindName(kind), " stop string at ", at));
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
  const EngineStats st = on->Stats();
  EXPECT_GT(st.spec_drafted_tokens, 0);
  EXPECT_GT(st.spec_accepted_tokens, 0);
  EXPECT_LT(st.steps, off->Stats().steps);
}

// On cuda-sim a verify step is not a decode step for the CUDA graphs (docs/CUDA_BACKEND.md,
// "Decode steps as graphs"): in the emulator's trace of one speculating request, its decode
// steps (one token) launch their graph and its verify steps (the last token plus drafts)
// issue their kernels call by call, interleaved, and the output is still plain decoding's.
TEST(SpecDecodeCudaSimTest, VerifyStepsRunCallByCallBesideDecodeGraphs) {
  const std::string name = "dcformer-f32-long-prompt";
  const std::string dir = testing::GoldenDir(name);
  const testing::Golden g = testing::LoadGolden(name);
  auto off = MakeEngine(dir, BackendKind::kCudaSim, SpecOptions(5, false, 0));
  auto on = MakeEngine(dir, BackendKind::kCudaSim, SpecOptions(5, false, 4));
  ASSERT_TRUE(off != nullptr && on != nullptr);
  const GenerationRequest r = Request(Prompts(g, 7)[1], 20, Kind::kGreedy, 0);
  const Collected plain = RunToEnd(*off, r);
  const std::string path = ::testing::TempDir() + "/spec_decode_trace.jsonl";
  std::remove(path.c_str());
  dcf::simt::SetTraceFile(path);
  const Collected spec = RunToEnd(*on, r);
  dcf::simt::SetTraceFile("");
  ExpectSameStream(plain, spec, "traced", Tolerance(BackendKind::kCudaSim));
  struct Step {
    bool decode = false;
    int graphs = 0, kernels = 0;  // kernels issued outside a graph
  };
  std::vector<Step> steps;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (absl::StrContains(line, "\"kind\":\"step\"")) {
      steps.emplace_back();
      steps.back().decode = absl::StrContains(line, "\"tokens\":1,\"seqs\":1}");
    } else if (!steps.empty() && absl::StrContains(line, "\"kind\":\"graph\"")) {
      ++steps.back().graphs;
    } else if (!steps.empty() && absl::StrContains(line, "\"kind\":\"kernel\"") &&
               !absl::StrContains(line, "\"in_graph\":true")) {
      ++steps.back().kernels;
    }
  }
  std::remove(path.c_str());
  ASSERT_GE(steps.size(), 3u);
  int decodes = 0, verifies = 0;
  for (size_t i = 1; i < steps.size(); ++i) {  // step 0: the prompt's prefill
    const Step& s = steps[i];
    if (s.decode) {
      // The first one captures the graph (its kernels are traced as they are issued into
      // the capture), every later one only launches it.
      EXPECT_EQ(s.graphs, 1) << "decode step " << i;
      if (decodes > 0) {
        EXPECT_EQ(s.kernels, 0) << "decode step " << i;
      }
      ++decodes;
    } else {
      ++verifies;
      EXPECT_EQ(s.graphs, 0) << "verify step " << i;
      EXPECT_GT(s.kernels, 0) << "verify step " << i;
    }
  }
  EXPECT_GT(decodes, 1);
  EXPECT_GT(verifies, 0);
}

}  // namespace
}  // namespace dcf
