// Prefix caching against the plain path it replaces, through the engine on real backends.
//
// The CPU backend is batch- and chunk-invariant: a prefix hit is a prefill split at the hit
// point, so with caching on every token and every logprob (top alternatives included) must
// be bit-identical to caching off, for every golden case (all have window layers), across
// block sizes 1, 5, 16 and prefill chunks of 1, 5, 16 and the whole prompt, and so it must
// with a 16-bit KV cache (bfloat16, float16: fresh rows are rounded as they are stored, so a
// chunk that starts at a hit reads what it would have computed). cuda-sim (the
// CUDA kernels on the emulator, float32) agrees within 1e-4 and greedy exactly: its kernels
// take any start position, a chunk after a hit being one. Random streams of requests
// sharing prefixes, with greedy and seeded sampling and penalties, under KV pressure that
// forces eviction and preemption, stream the same with caching on and off; and tenants with
// different cache_salts never hit each other's blocks.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backends/backend_factory.h"
#include "engine/serving/engine.h"
#include "gtest/gtest.h"
#include "tests/testing/collected_stream.h"
#include "tests/testing/golden.h"

namespace dcf {
namespace {

using testing::Collected;
using testing::RunToEnd;

std::unique_ptr<Engine> MakeEngine(const std::string& golden, BackendKind kind,
                                   const EngineOptions& options,
                                   DType kv_cache_dtype = DType::kF32) {
  BackendOptions b;
  b.kind = kind;
  if (kind == BackendKind::kCudaSim) b.dtype = DType::kF32;
  if (kind == BackendKind::kCpu) b.kv_cache_dtype = kv_cache_dtype;
  auto m = LoadModel(testing::GoldenDir(golden), b);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return nullptr;
  auto e = Engine::Create(std::move(m->backend), nullptr, options);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

GenerationRequest Request(std::vector<int32_t> prompt, int max_new) {
  GenerationRequest r;
  r.prompt_tokens = std::move(prompt);
  r.sampling.temperature = 0;
  r.stopping.max_new_tokens = max_new;
  r.output.text = false;
  r.output.logprobs = true;
  r.output.top_logprobs = kMaxTopLogprobs;
  return r;
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

// Every token, logprob and top alternative of `on` bit-identical to `off` (or, with
// `tolerance` > 0, tokens equal and logprobs within it).
void ExpectSameStream(const Collected& off, const Collected& on, const std::string& what,
                      double tolerance = 0) {
  ASSERT_TRUE(off.finished && on.finished) << what;
  EXPECT_EQ(off.final_chunk.finish_reason, on.final_chunk.finish_reason) << what;
  ASSERT_EQ(off.ids(), on.ids()) << what;
  for (size_t i = 0; i < off.tokens.size(); ++i) {
    const TokenOutput& a = off.tokens[i];
    const TokenOutput& b = on.tokens[i];
    ASSERT_EQ(a.top.size(), b.top.size()) << what << " token " << i;
    if (tolerance == 0) {
      ASSERT_EQ(Bits(a.logprob), Bits(b.logprob)) << what << " token " << i;
    } else {
      ASSERT_NEAR(a.logprob, b.logprob, tolerance) << what << " token " << i;
    }
    for (size_t k = 0; k < a.top.size(); ++k) {
      if (tolerance == 0) {
        ASSERT_EQ(a.top[k].token, b.top[k].token) << what << " token " << i << " alt " << k;
        ASSERT_EQ(Bits(a.top[k].logprob), Bits(b.top[k].logprob))
            << what << " token " << i << " alt " << k;
      } else {
        ASSERT_NEAR(a.top[k].logprob, b.top[k].logprob, tolerance)
            << what << " token " << i << " alt " << k;
      }
    }
  }
}

// Requests that share prefixes with the golden sequence S = prompt + greedy continuation,
// run one after the other: the prompt (a miss: it must reproduce the golden continuation),
// the prompt again, prefixes of S reaching into blocks the first request's decode wrote, and
// half the prompt with a new tail. `shared[i]`: tokens request i shares with S.
struct GoldenPlan {
  std::vector<GenerationRequest> requests;
  std::vector<int> shared;
};

GoldenPlan PlanFor(const testing::Golden& g) {
  GoldenPlan plan;
  const int P = static_cast<int>(g.prompt.size()), S = static_cast<int>(g.sequence.size());
  const auto prefix = [&](int n) {
    return std::vector<int32_t>(g.sequence.begin(), g.sequence.begin() + n);
  };
  const auto add = [&](std::vector<int32_t> prompt, int max_new, int shared) {
    plan.requests.push_back(Request(std::move(prompt), max_new));
    plan.shared.push_back(shared);
  };
  add(g.prompt, static_cast<int>(g.greedy.size()), P);
  add(g.prompt, static_cast<int>(g.greedy.size()), P);
  add(prefix(P + 7), 6, P + 7);
  add(prefix(S - 1), 1, S - 1);
  std::vector<int32_t> half = prefix(P / 2);
  for (int32_t t : {7, 250, 3, 99, 12, 180, 41, 5, 77}) half.push_back(t);
  add(half, 8, P / 2);
  add(prefix(S), 4, S);
  return plan;
}

struct GoldenParam {
  std::string name;
  int block_size;
  int chunk;  // prefill chunk; 0 = the whole prompt in one step
  DType kv = DType::kF32;  // the KV cache dtype
};

std::string GoldenName(const ::testing::TestParamInfo<GoldenParam>& info) {
  std::string n = absl::StrCat(info.param.name, "_B", info.param.block_size, "_chunk",
                               info.param.chunk);
  if (info.param.kv != DType::kF32) absl::StrAppend(&n, "_kv", DTypeName(info.param.kv));
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

EngineOptions GoldenOptions(const GoldenParam& p, bool prefix_caching) {
  EngineOptions o;
  o.block_size = p.block_size;
  o.max_prefill_chunk_tokens = p.chunk;
  o.max_num_batched_tokens = p.chunk == 0 ? 256 : std::max(p.chunk, 8);
  o.prefix_caching = prefix_caching;
  o.kv_num_blocks = {256, 256};
  return o;
}

class PrefixCacheGoldenTest : public ::testing::TestWithParam<GoldenParam> {};

TEST_P(PrefixCacheGoldenTest, BitIdenticalWithCachingOnAndOff) {
  const GoldenParam& p = GetParam();
  const testing::Golden g = testing::LoadGolden(p.name);
  const GoldenPlan plan = PlanFor(g);
  auto off = MakeEngine(p.name, BackendKind::kCpu, GoldenOptions(p, false), p.kv);
  auto on = MakeEngine(p.name, BackendKind::kCpu, GoldenOptions(p, true), p.kv);
  ASSERT_TRUE(off != nullptr && on != nullptr);
  int64_t cached = 0;
  // The tokens each earlier request computed (prompt and generated, but the last sampled):
  // all stay cached (a large pool).
  std::vector<std::vector<int32_t>> computed;
  for (size_t i = 0; i < plan.requests.size(); ++i) {
    const std::string what = absl::StrCat("request ", i);
    const std::vector<int32_t>& prompt = plan.requests[i].prompt_tokens;
    const Collected a = RunToEnd(*off, plan.requests[i]);
    const Collected b = RunToEnd(*on, plan.requests[i]);
    ExpectSameStream(a, b, what);
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_EQ(a.final_chunk.usage.cached_tokens, 0) << what;
    // The hit is every full block of the longest prefix an earlier request computed, leaving
    // at least one token to compute. With a float32 cache the greedy tokens are the golden
    // ones, so that is the plan's shared length of S.
    const int len = static_cast<int>(prompt.size());
    int common = 0;
    for (const std::vector<int32_t>& c : computed) {
      int n = 0;
      while (n < len && n < static_cast<int>(c.size()) && c[n] == prompt[n]) ++n;
      common = std::max(common, n);
    }
    const int want = std::min(common, len - 1) / p.block_size * p.block_size;
    if (p.kv == DType::kF32) {
      EXPECT_EQ(want, i == 0 ? 0 : std::min(plan.shared[i], len - 1) / p.block_size *
                                       p.block_size)
          << what;
    }
    EXPECT_EQ(b.final_chunk.usage.cached_tokens, want) << what;
    cached += b.final_chunk.usage.cached_tokens;
    std::vector<int32_t> seq = prompt;
    const std::vector<int32_t> ids = b.ids();
    seq.insert(seq.end(), ids.begin(), ids.end() - (ids.empty() ? 0 : 1));
    computed.push_back(std::move(seq));
  }
  // The first request reproduces the reference (an f32 cache: the reference's own).
  const Collected first = RunToEnd(*on, plan.requests[0]);
  if (p.kv == DType::kF32) {
    EXPECT_EQ(first.ids(), g.greedy);
    for (size_t i = 0; i < first.tokens.size() && i < g.greedy_logprobs.size(); ++i) {
      EXPECT_NEAR(first.tokens[i].logprob, g.greedy_logprobs[i], 1e-4) << i;
    }
  }
  const EngineStats st = on->Stats();
  EXPECT_EQ(st.prefix_cache_hits, cached + first.final_chunk.usage.cached_tokens);
  EXPECT_GT(st.prefix_cache_hits, 0);
  EXPECT_EQ(st.kv_blocks_used[0], 0);
  EXPECT_EQ(st.kv_blocks_used[1], 0);
  EXPECT_GT(st.kv_blocks_cached[0], 0);
  EXPECT_EQ(off->Stats().prefix_cache_hits, 0);
  EXPECT_EQ(off->Stats().kv_blocks_cached[0], 0);
}

std::vector<GoldenParam> GoldenParams() {
  std::vector<GoldenParam> out;
  for (const std::string& name : testing::GoldenCases()) {
    for (int block_size : {1, 5, 16}) {
      for (int chunk : {0, 1, 5, 16}) out.push_back({name, block_size, chunk});
    }
    // 16-bit caches: the same invariance (fewer shapes; the rounding is per row, not per
    // shape).
    for (DType kv : {DType::kBF16, DType::kF16}) {
      for (int block_size : {1, 16}) {
        for (int chunk : {0, 1, 5}) out.push_back({name, block_size, chunk, kv});
      }
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Golden, PrefixCacheGoldenTest, ::testing::ValuesIn(GoldenParams()),
                         GoldenName);

// The CUDA kernels on the emulator, float32: a chunk that starts at a hit reads the cached
// keys like any later chunk. Within 1e-4 of caching off, greedy-exact.
TEST(PrefixCacheCudaSimTest, MatchesCachingOffWithinTolerance) {
  const std::string name = "dcformer-f32-long-prompt";
  const testing::Golden g = testing::LoadGolden(name);
  const GoldenPlan plan = PlanFor(g);
  for (const GoldenParam& p : {GoldenParam{name, 5, 5}, GoldenParam{name, 16, 0}}) {
    auto off = MakeEngine(name, BackendKind::kCudaSim, GoldenOptions(p, false));
    auto on = MakeEngine(name, BackendKind::kCudaSim, GoldenOptions(p, true));
    ASSERT_TRUE(off != nullptr && on != nullptr);
    for (size_t i = 0; i < plan.requests.size(); ++i) {
      const std::string what = absl::StrCat("B", p.block_size, " request ", i);
      const Collected a = RunToEnd(*off, plan.requests[i]);
      const Collected b = RunToEnd(*on, plan.requests[i]);
      ExpectSameStream(a, b, what, 1e-4);
      if (::testing::Test::HasFatalFailure()) return;
      if (i == 0) {
        EXPECT_EQ(b.ids(), g.greedy);
      }
      if (i == 1) {
        EXPECT_GT(b.final_chunk.usage.cached_tokens, 0) << what;
      }
    }
    EXPECT_GT(on->Stats().prefix_cache_hits, 0);
  }
}

// A random stream: prompts from three families of shared prefixes with random tails,
// greedy, seeded sampling and seeded sampling with penalties, arriving in waves into a pool
// that holds about two of them.
struct StreamRequest {
  GenerationRequest request;
  std::string kind;
};

std::vector<StreamRequest> RandomStream(uint64_t seed, int n) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int32_t>> families(3);
  for (auto& f : families) {
    for (int i = 0; i < 50; ++i) f.push_back(static_cast<int32_t>(3 + rng() % 290));
  }
  std::vector<StreamRequest> out;
  for (int i = 0; i < n; ++i) {
    const auto& fam = families[rng() % families.size()];
    std::vector<int32_t> prompt(fam.begin(), fam.begin() + rng() % 51);
    const int tail = 1 + static_cast<int>(rng() % 15);
    for (int k = 0; k < tail; ++k) prompt.push_back(static_cast<int32_t>(3 + rng() % 290));
    StreamRequest r{Request(prompt, 5 + static_cast<int>(rng() % 31)), "greedy"};
    r.request.output.top_logprobs = 3;
    switch (i % 3) {
      case 1:
        r.kind = "seeded";
        r.request.sampling.temperature = 0.8f;
        r.request.sampling.top_k = 40;
        r.request.sampling.top_p = 0.9f;
        r.request.sampling.seed = rng();
        break;
      case 2:
        r.kind = "penalised";
        r.request.sampling.temperature = 1.0f;
        r.request.sampling.repetition_penalty = 1.3f;
        r.request.sampling.presence_penalty = 0.5f;
        r.request.sampling.frequency_penalty = 0.4f;
        r.request.sampling.seed = rng();
        break;
      default:
        break;
    }
    out.push_back(std::move(r));
  }
  return out;
}

// Runs `stream` in waves of `wave` requests (the next wave is sent once the first request
// of the previous one streamed its first token, so waves overlap).
std::vector<Collected> RunStream(Engine& engine, const std::vector<StreamRequest>& stream,
                                 int wave) {
  std::vector<Collected> got(stream.size());
  std::vector<RequestHandle> handles;
  for (size_t i = 0; i < stream.size(); ++i) {
    if (i > 0 && i % wave == 0) got[i - wave].TakeOne(handles[i - wave].stream());
    auto h = engine.Enqueue(stream[i].request);
    EXPECT_TRUE(h.ok()) << h.status();
    if (!h.ok()) return got;
    handles.push_back(std::move(*h));
  }
  for (size_t i = 0; i < stream.size(); ++i) got[i].Drain(handles[i].stream());
  return got;
}

TEST(PrefixCacheStreamTest, RandomSharedPrefixStreamsUnderKvPressureMatchCachingOff) {
  const std::string name = "dcformer-f32-long-prompt";
  const std::vector<StreamRequest> stream = RandomStream(2024, 36);
  EngineOptions o;
  o.block_size = 5;
  o.max_num_seqs = 6;
  o.max_num_batched_tokens = 24;
  o.kv_num_blocks = {22, 14};  // 110 tokens of global blocks: about two requests
  o.watermark = 0;
  EngineOptions o_off = o;
  o_off.prefix_caching = false;
  auto off = MakeEngine(name, BackendKind::kCpu, o_off);
  auto on = MakeEngine(name, BackendKind::kCpu, o);
  ASSERT_TRUE(off != nullptr && on != nullptr);
  const std::vector<Collected> a = RunStream(*off, stream, 6);
  const std::vector<Collected> b = RunStream(*on, stream, 6);
  int hits = 0;
  for (size_t i = 0; i < stream.size(); ++i) {
    ExpectSameStream(a[i], b[i], absl::StrCat("request ", i, " (", stream[i].kind, ")"));
    if (::testing::Test::HasFatalFailure()) return;
    EXPECT_EQ(b[i].final_chunk.finish_reason, FinishReason::kLength);
    hits += b[i].final_chunk.usage.cached_tokens > 0;
  }
  const EngineStats st = on->Stats();
  EXPECT_GT(hits, 5);
  EXPECT_GT(st.prefix_cache_hits, 0);
  EXPECT_GT(st.prefix_cache_evictions[0], 0) << "the pool was meant to force evictions";
  EXPECT_GT(st.num_preemptions, 0) << "the pool was meant to force preemption";
  EXPECT_LT(st.prompt_tokens_computed, off->Stats().prompt_tokens_computed);
  EXPECT_EQ(st.kv_blocks_used[0], 0);
  EXPECT_EQ(st.kv_blocks_used[1], 0);
}

TEST(PrefixCacheStreamTest, TenantsWithDifferentSaltsNeverShare) {
  const std::string name = "dcformer-f32-long-prompt";
  EngineOptions o;
  auto engine = MakeEngine(name, BackendKind::kCpu, o);
  ASSERT_TRUE(engine != nullptr);
  std::mt19937_64 rng(5);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(static_cast<int32_t>(3 + rng() % 290));
  const auto run = [&](const std::string& salt) {
    GenerationRequest r = Request(prompt, 6);
    r.cache_salt = salt;
    return RunToEnd(*engine, r);
  };
  const Collected a1 = run("tenant-a");
  const Collected b1 = run("tenant-b");
  const Collected none1 = run("");
  const Collected a2 = run("tenant-a");
  const Collected b2 = run("tenant-b");
  const Collected none2 = run("");
  EXPECT_EQ(a1.final_chunk.usage.cached_tokens, 0);
  EXPECT_EQ(b1.final_chunk.usage.cached_tokens, 0) << "tenant b hit tenant a's blocks";
  EXPECT_EQ(none1.final_chunk.usage.cached_tokens, 0) << "an unsalted request hit salted blocks";
  EXPECT_EQ(a2.final_chunk.usage.cached_tokens, 32);  // 39 / 16 full blocks
  EXPECT_EQ(b2.final_chunk.usage.cached_tokens, 32);
  EXPECT_EQ(none2.final_chunk.usage.cached_tokens, 32);
  for (const Collected* c : {&b1, &none1, &a2, &b2, &none2}) ExpectSameStream(a1, *c, "salted");
  EXPECT_EQ(engine->Stats().prefix_cache_hits, 3 * 32);
}

TEST(PrefixCacheStreamTest, TooLongASaltIsRefused) {
  auto engine = MakeEngine("dcformer-f32-long-prompt", BackendKind::kCpu, EngineOptions());
  ASSERT_TRUE(engine != nullptr);
  GenerationRequest r = Request({5, 6, 7}, 2);
  r.cache_salt = std::string(kMaxCacheSaltBytes + 1, 's');
  const auto h = engine->Enqueue(r);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(h.status().message().find("cache_salt"), std::string::npos) << h.status();
  r.cache_salt.pop_back();
  EXPECT_TRUE(engine->Enqueue(r).ok());
}

}  // namespace
}  // namespace dcf
