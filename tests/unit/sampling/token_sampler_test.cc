#include "engine/sampling/token_sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/sampling/philox.h"
#include "gtest/gtest.h"
#include "tests/testing/reference_sampler.h"

namespace dcf {
namespace {

// One sequence's sampling as the engine drives it: a draw counter and the penalty state.
class Sampler {
 public:
  Sampler(const SamplingParams& params, std::vector<int32_t> prompt, int vocab)
      : params_(params), penalties_(vocab) {
    penalties_.Reset(prompt, {});
  }
  int32_t Sample(const std::vector<float>& logits) {
    const int32_t t = SampleToken(logits, params_, params_.seed.value_or(0), step_++,
                                  &penalties_, &scratch_);
    penalties_.Record(t);
    return t;
  }
  void ApplyPenalties(absl::Span<float> l) const { penalties_.Apply(params_, l); }

 private:
  SamplingParams params_;
  PenaltyState penalties_;
  SamplerScratch scratch_;
  uint64_t step_ = 0;
};

// Known-answer vectors of Philox4x32-10 from the Random123 distribution (kat_vectors).
TEST(PhiloxTest, KnownAnswers) {
  using philox::Uint4;
  const Uint4 a = philox::Philox4x32({0, 0, 0, 0}, 0, 0);
  EXPECT_EQ(a.x, 0x6627e8d5u);
  EXPECT_EQ(a.y, 0xe169c58du);
  EXPECT_EQ(a.z, 0xbc57ac4cu);
  EXPECT_EQ(a.w, 0x9b00dbd8u);
  const Uint4 b = philox::Philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                                     0xffffffffu, 0xffffffffu);
  EXPECT_EQ(b.x, 0x408f276du);
  EXPECT_EQ(b.y, 0x41c83b0eu);
  EXPECT_EQ(b.z, 0xa20bc7c6u);
  EXPECT_EQ(b.w, 0x6d5451fdu);
  const Uint4 c = philox::Philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                                     0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(c.x, 0xd16cfe09u);
  EXPECT_EQ(c.y, 0x94fdccebu);
  EXPECT_EQ(c.z, 0x5001e420u);
  EXPECT_EQ(c.w, 0x24126ea1u);
}

TEST(PhiloxTest, UniformIsAPureFunctionOfSeedAndStepAndLooksUniform) {
  EXPECT_EQ(philox::Uniform(7, 3), philox::Uniform(7, 3));
  EXPECT_NE(philox::Uniform(7, 3), philox::Uniform(7, 4));
  EXPECT_NE(philox::Uniform(7, 3), philox::Uniform(8, 3));
  double sum = 0;
  int below_tenth = 0;
  constexpr int kN = 100000;
  for (int i = 0; i < kN; ++i) {
    const double u = philox::Uniform(42, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    below_tenth += u < 0.1;
  }
  EXPECT_NEAR(sum / kN, 0.5, 0.005);
  EXPECT_NEAR(below_tenth / static_cast<double>(kN), 0.1, 0.005);
}

// Logits whose softmax is `probs`.
std::vector<float> LogitsOf(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

// Empirical distribution of `n` draws (fixed seed).
std::vector<double> Histogram(SamplingParams params, const std::vector<float>& logits, int n) {
  params.seed = 1234;
  Sampler s(params, {}, static_cast<int>(logits.size()));
  std::vector<double> h(logits.size(), 0);
  for (int i = 0; i < n; ++i) h[s.Sample(logits)] += 1.0 / n;
  return h;
}

void ExpectNear(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "id " << i;
}

const std::vector<double> kProbs = {0.5, 0.3, 0.15, 0.05};
constexpr int kDraws = 40000;
constexpr double kTol = 0.012;  // ~5 sigma at p = 0.5 for 40000 draws

TEST(SamplerTest, PlainSamplingFollowsSoftmax) {
  ExpectNear(Histogram({}, LogitsOf(kProbs), kDraws), kProbs, kTol);
}

TEST(SamplerTest, TopK) {
  SamplingParams p;
  p.top_k = 2;
  ExpectNear(Histogram(p, LogitsOf(kProbs), kDraws), {0.625, 0.375, 0, 0}, kTol);
}

TEST(SamplerTest, TopP) {
  SamplingParams p;
  p.top_p = 0.75f;  // 0.5 < 0.75 <= 0.8: ids 0 and 1
  ExpectNear(Histogram(p, LogitsOf(kProbs), kDraws), {0.625, 0.375, 0, 0}, kTol);
  p.top_p = 0.9f;  // ids 0, 1, 2
  ExpectNear(Histogram(p, LogitsOf(kProbs), kDraws), {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0},
             kTol);
}

TEST(SamplerTest, TopPWithNucleusBeyondTheFirstSortedPrefix) {
  // 1000 equal logits: the nucleus for p = 0.5 is ids 0..499 (ties by lowest id), more than
  // the 64 and 256 ids of the first sorted prefixes.
  SamplingParams p;
  p.top_p = 0.5f;
  const std::vector<double> h = Histogram(p, std::vector<float>(1000, 0.0f), kDraws);
  double low = 0, kept = 0;
  for (int i = 0; i < 1000; ++i) {
    if (i < 500) kept += h[i];
    if (i < 250) low += h[i];
  }
  EXPECT_NEAR(kept, 1.0, 1e-9);
  EXPECT_NEAR(low, 0.5, kTol);
}

TEST(SamplerTest, TopPMatchesFullSortOnRandomLogits) {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0, 3);
  std::vector<float> logits(2000);
  for (float& v : logits) v = normal(rng);
  // Reference nucleus by a full sort.
  std::vector<int> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::sort(ids.begin(), ids.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  double z = 0;
  for (float v : logits) z += std::exp(static_cast<double>(v));
  std::vector<bool> in_nucleus(logits.size(), false);
  double cum = 0, nucleus_mass = 0;
  for (int id : ids) {
    in_nucleus[id] = true;
    cum += std::exp(static_cast<double>(logits[id])) / z;
    nucleus_mass = cum;
    if (cum >= 0.9) break;
  }
  SamplingParams p;
  p.top_p = 0.9f;
  const std::vector<double> h = Histogram(p, logits, kDraws);
  for (size_t i = 0; i < h.size(); ++i) {
    if (!in_nucleus[i]) {
      EXPECT_EQ(h[i], 0) << "id " << i << " is outside the nucleus";
    }
  }
  const int top = ids[0];
  EXPECT_NEAR(h[top], std::exp(static_cast<double>(logits[top])) / z / nucleus_mass, kTol);
}

TEST(SamplerTest, MinP) {
  SamplingParams p;
  p.min_p = 0.25f;  // keep p >= 0.125: ids 0, 1, 2
  ExpectNear(Histogram(p, LogitsOf(kProbs), kDraws), {0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0},
             kTol);
  p.min_p = 0.7f;  // keep p >= 0.35: id 0 only
  ExpectNear(Histogram(p, LogitsOf(kProbs), kDraws), {1, 0, 0, 0}, 1e-9);
}

TEST(SamplerTest, Temperature) {
  SamplingParams p;
  p.temperature = 0.5f;  // p^2 renormalized
  double z = 0;
  for (double q : kProbs) z += q * q;
  std::vector<double> want;
  for (double q : kProbs) want.push_back(q * q / z);
  ExpectNear(Histogram(p, LogitsOf(kProbs), kDraws), want, kTol);
}

TEST(SamplerTest, GreedyPicksLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, {}, 4);
  EXPECT_EQ(s.Sample(std::vector<float>{1, 3, 3, 2}), 1);
}

// Below kGreedyBelowTemperature (1e-5) a temperature is greedy, as 0 is, with every filter:
// 1 / T overflows a float at 1e-40 and l / T at 1e-38 for these logits, which made the draw
// walk infinities (a token of the wrong end of the distribution, or id 0). Just above the
// bound two tied logits are still drawn at random.
TEST(SamplerTest, TemperaturesBelowTheGreedyBoundAreGreedy) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 8.0f);
  std::vector<float> logits(1000);
  for (float& l : logits) l = normal(rng);
  const auto argmax = std::max_element(logits.begin(), logits.end()) - logits.begin();
  ASSERT_GT(*std::max_element(logits.begin(), logits.end()), 3.5f);
  for (float t : {9e-6f, 1e-30f, 1e-38f, 1e-40f, 1e-45f}) {
    for (int filter = 0; filter < 4; ++filter) {
      SamplingParams p;
      p.temperature = t;
      if (filter == 1) p.top_k = 5;
      if (filter == 2) p.top_p = 0.9f;
      if (filter == 3) p.min_p = 0.1f;
      for (uint64_t seed = 0; seed < 8; ++seed) {
        p.seed = seed;
        EXPECT_EQ(Sampler(p, {}, 1000).Sample(logits), argmax)
            << "temperature " << t << ", filter " << filter << ", seed " << seed;
      }
    }
  }
  for (float t : {9e-6f, 2e-5f}) {  // tied logits: greedy takes the lower id, sampling either
    SamplingParams p;
    p.temperature = t;
    std::set<int32_t> drawn;
    for (uint64_t seed = 0; seed < 32; ++seed) {
      p.seed = seed;
      drawn.insert(Sampler(p, {}, 2).Sample({1.0f, 1.0f}));
    }
    const std::set<int32_t> want =
        t < kGreedyBelowTemperature ? std::set<int32_t>{0} : std::set<int32_t>{0, 1};
    EXPECT_EQ(drawn, want) << t;
  }
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedDifferentTokens) {
  const std::vector<float> logits = LogitsOf({0.25, 0.25, 0.25, 0.25});
  SamplingParams p;
  p.seed = 7;
  Sampler a(p, {}, 4), b(p, {}, 4);
  p.seed = 8;
  Sampler c(p, {}, 4);
  std::vector<int32_t> ta, tb, tc;
  for (int i = 0; i < 64; ++i) {
    ta.push_back(a.Sample(logits));
    tb.push_back(b.Sample(logits));
    tc.push_back(c.Sample(logits));
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

TEST(SamplerTest, RepetitionPenaltyOverPromptAndOutput) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0f;
  Sampler s(p, /*prompt=*/{1, 2}, 4);
  std::vector<float> l = {4, 4, -1, 3};
  s.ApplyPenalties(absl::MakeSpan(l));
  EXPECT_EQ(l, (std::vector<float>{4, 2, -2, 3}));
  // Output tokens join the set: after sampling 0, it is penalized too.
  EXPECT_EQ(s.Sample(std::vector<float>{5, 0, 0, 0}), 0);
  l = {4, 4, -1, 3};
  s.ApplyPenalties(absl::MakeSpan(l));
  EXPECT_EQ(l, (std::vector<float>{2, 2, -2, 3}));
}

TEST(SamplerTest, PresenceAndFrequencyPenaltiesOverGeneratedTokens) {
  SamplingParams p;
  p.temperature = 0;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  Sampler s(p, /*prompt=*/{3}, 4);  // the prompt does not count for these
  const std::vector<float> favour2 = {0, 0, 10, 0};
  EXPECT_EQ(s.Sample(favour2), 2);
  EXPECT_EQ(s.Sample(favour2), 2);
  std::vector<float> l = {1, 1, 1, 1};
  s.ApplyPenalties(absl::MakeSpan(l));
  EXPECT_FLOAT_EQ(l[2], 1 - 0.5f - 2 * 0.25f);
  EXPECT_FLOAT_EQ(l[3], 1);
  EXPECT_FLOAT_EQ(l[0], 1);
  // Greedy follows the penalized logits.
  EXPECT_EQ(s.Sample(std::vector<float>{0, 0, 0.9f, 0}), 0);
}

// A NaN or an infinity anywhere in the raw logits (a broken model) draws nothing: -1 on every
// path (greedy, plain, top-k, top-p, min-p, penalties), never a silent token.
TEST(SamplerTest, NonFiniteLogitsDrawNothing) {
  std::vector<SamplingParams> all(6);
  all[0].temperature = 0;
  all[2].top_k = 3;
  all[3].top_p = 0.5f;
  all[4].min_p = 0.1f;
  all[5].repetition_penalty = 1.3f;
  all[5].frequency_penalty = 0.5f;
  PenaltyState penalties(16);
  penalties.Reset({1, 2}, {3});
  SamplerScratch scratch;
  for (const SamplingParams& p : all) {
    for (float bad : {NAN, INFINITY, -INFINITY}) {
      for (int at : {0, 7, 15}) {
        std::vector<float> l(16);
        for (int i = 0; i < 16; ++i) l[i] = 0.1f * static_cast<float>(i % 5);
        l[at] = bad;
        EXPECT_EQ(SampleToken(l, p, 5, 0, &penalties, &scratch), -1) << bad << " at " << at;
      }
    }
    std::vector<float> fine(16, 0.5f);
    fine[9] = 3.0f;
    EXPECT_GE(SampleToken(fine, p, 5, 0, &penalties, &scratch), 0);  // and finite rows draw
  }
  // The largest finite floats are logits like any other.
  std::vector<float> big(8, -std::numeric_limits<float>::max());
  big[4] = std::numeric_limits<float>::max();
  SamplingParams greedy;
  greedy.temperature = 0;
  EXPECT_EQ(SampleToken(big, greedy, 0, 0, nullptr, &scratch), 4);
}

TEST(SamplerTest, LogprobsAreLogSoftmaxOfRawLogits) {
  const std::vector<float> l = LogitsOf(kProbs);
  std::vector<TopLogprob> top;
  EXPECT_NEAR(ComputeLogprobs(l, 2, 3, &top), std::log(0.15), 1e-6);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].token, 0);
  EXPECT_EQ(top[1].token, 1);
  EXPECT_EQ(top[2].token, 2);
  EXPECT_NEAR(top[1].logprob, std::log(0.3), 1e-6);
  EXPECT_NEAR(ComputeLogprobs(l, 3, 0, nullptr), std::log(0.05), 1e-6);
}

TEST(SamplerTest, ValidationNamesTheField) {
  const auto check = [](SamplingParams p, const char* field) {
    const absl::Status st = ValidateSamplingParams(p);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(st.message().find(field), absl::string_view::npos) << st.message();
  };
  SamplingParams p;
  EXPECT_TRUE(ValidateSamplingParams(p).ok());
  p.temperature = std::nanf("");
  check(p, "temperature");
  p = {};
  p.temperature = -1;
  check(p, "temperature");
  p = {};
  p.top_p = 0;
  check(p, "top_p");
  p = {};
  p.top_p = 1.5f;
  check(p, "top_p");
  p = {};
  p.top_k = -1;
  check(p, "top_k");
  p = {};
  p.min_p = 1.5f;
  check(p, "min_p");
  p = {};
  p.repetition_penalty = 0;
  check(p, "repetition_penalty");
  p = {};
  p.presence_penalty = 2.5f;
  check(p, "presence_penalty");
  p = {};
  p.frequency_penalty = -3;
  check(p, "frequency_penalty");
}

// The O(V) sampler picks exactly the token of the old full-sort sampler
// (tests/testing/reference_sampler.h) for the same seed and step, over random and
// adversarial logits and every combination of top-k, top-p and min-p.
struct LogitCase {
  std::string name;
  std::vector<float> logits;
};

std::vector<LogitCase> AdversarialLogits() {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0, 1);
  std::vector<LogitCase> cases;
  for (const int V : {1, 2, 7, 300, 5000, 50257}) {
    std::vector<float> l(V);
    for (float& v : l) v = 3 * normal(rng);
    cases.push_back({"normal_" + std::to_string(V), l});
  }
  const int V = 3001;
  cases.push_back({"flat", std::vector<float>(V, 0.25f)});
  std::vector<float> l(V);
  for (int i = 0; i < V; ++i) l[i] = std::round(2 * normal(rng)) / 2;  // many ties
  cases.push_back({"quantized", l});
  for (int i = 0; i < V; ++i) l[i] = i % 2 == 0 ? 1.0f : 0.0f;  // two levels
  cases.push_back({"two_levels", l});
  for (int i = 0; i < V; ++i) l[i] = i % 3 == 0 ? -0.0f : i % 3 == 1 ? 0.0f : -1.0f;
  cases.push_back({"signed_zeros", l});  // -0 and +0 are one value: ties by id
  for (int i = 0; i < V; ++i) l[i] = normal(rng) * 1e-6f;  // nearly flat, distinct keys
  cases.push_back({"nearly_flat", l});
  for (int i = 0; i < V; ++i) l[i] = i < 3 ? 50.0f - i : -1e4f * (1 + normal(rng) * 0.01f);
  cases.push_back({"peaked_underflow", l});  // all but three probabilities underflow to 0
  for (int i = 0; i < V; ++i) l[i] = normal(rng) * 30;  // wide range, mixed signs
  cases.push_back({"wide", l});
  for (int i = 0; i < V; ++i) l[i] = -std::abs(normal(rng)) - 1e30f * (i % 5 == 0);
  cases.push_back({"huge_negative", l});
  for (int i = 0; i < V; ++i) l[i] = i == V - 1 ? 1.0f : 0.0f;  // maximum at the last id
  cases.push_back({"max_last", l});
  return cases;
}

TEST(SamplerTest, LinearTimeSamplerMatchesTheFullSortReference) {
  SamplerScratch scratch;
  testing::ReferenceSamplerScratch ref_scratch;
  int compared = 0;
  for (const LogitCase& c : AdversarialLogits()) {
    const int V = static_cast<int>(c.logits.size());
    for (const float temperature : {1.0f, 0.7f, 3.0f}) {
      for (const int top_k : {0, 1, 2, 5, 50, 1500, V - 1, V, V + 3}) {
        for (const float top_p : {1.0f, 0.9f, 0.5f, 0.999999f, 1e-4f}) {
          for (const float min_p : {0.0f, 0.05f, 1.0f}) {
            SamplingParams p;
            p.temperature = temperature;
            p.top_k = top_k < 0 ? 0 : top_k;
            p.top_p = top_p;
            p.min_p = min_p;
            const int draws = V > 10000 ? 2 : 6;
            for (int step = 0; step < draws; ++step) {
              const int32_t want =
                  testing::ReferenceSampleToken(c.logits, p, 99, step, nullptr, &ref_scratch);
              const int32_t got = SampleToken(c.logits, p, 99, step, nullptr, &scratch);
              ASSERT_EQ(got, want) << c.name << " T " << temperature << " top_k " << p.top_k
                                   << " top_p " << top_p << " min_p " << min_p << " step "
                                   << step;
              ++compared;
            }
          }
        }
      }
    }
  }
  RecordProperty("compared", compared);
}

// Many draws over a random vocabulary: the same token stream, draw after draw, for the
// sampling settings requests use most.
TEST(SamplerTest, LinearTimeSamplerMatchesTheReferenceOverManyDraws) {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0, 2.5f);
  std::vector<float> logits(20000);
  SamplerScratch scratch;
  testing::ReferenceSamplerScratch ref_scratch;
  const SamplingParams settings[] = {
      [] { SamplingParams p; p.top_p = 0.95f; return p; }(),
      [] { SamplingParams p; p.top_k = 40; p.top_p = 0.9f; p.temperature = 0.8f; return p; }(),
      [] { SamplingParams p; p.min_p = 0.1f; return p; }(),
      [] { SamplingParams p; p.top_k = 10000; p.min_p = 0.001f; return p; }()};
  for (const SamplingParams& p : settings) {
    for (int step = 0; step < 300; ++step) {
      if (step % 10 == 0) {
        for (float& v : logits) v = normal(rng);
      }
      ASSERT_EQ(SampleToken(logits, p, 5, step, nullptr, &scratch),
                testing::ReferenceSampleToken(logits, p, 5, step, nullptr, &ref_scratch))
          << "top_k " << p.top_k << " top_p " << p.top_p << " min_p " << p.min_p << " step "
          << step;
    }
  }
}

}  // namespace
}  // namespace dcf
