// The device sampler against the host reference (engine/sampling/token_sampler.h) on the same
// logits: the same token for greedy and seeded sampling with top-k / top-p / min-p /
// penalties (the logits here are random, so no draw lands within float rounding of a
// cumulative boundary), logprobs within 1e-4, the same top-n ids; then the penalty update.
#include "engine/cuda/sampling_rows.h"

#include <cmath>
#include <string>

#include "engine/sampling/token_sampler.h"
#include "gtest/gtest.h"
#if defined(DCF_CUDA_SIM)
#include "engine/simt/simt_testing.h"
#endif
#include "tests/unit/cuda/kernel_test_util.h"

namespace dcf::cuda_test {
namespace {

struct Case {
  std::string name;
  SamplingParams params;
  int slot = -1;  // penalty slot (penalties need one)
  int top_n = 0;
  bool logprob = true;
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  auto add = [&](std::string name, auto&& set, int slot = -1, int top_n = 0) {
    Case c;
    c.name = std::move(name);
    set(c.params);
    c.slot = slot;
    c.top_n = top_n;
    cases.push_back(c);
  };
  add(
      "greedy", [](SamplingParams& p) { p.temperature = 0; }, -1, 5);
  add(
      "greedy_penalties",
      [](SamplingParams& p) {
        p.temperature = 0;
        p.repetition_penalty = 1.8f;
        p.presence_penalty = 0.7f;
        p.frequency_penalty = 0.4f;
      },
      0);
  add(
      "temperature", [](SamplingParams& p) { p.temperature = 0.8f; }, -1, 20);
  add("temperature_hot", [](SamplingParams& p) { p.temperature = 2.5f; });
  add("top_k_1", [](SamplingParams& p) { p.top_k = 1; });
  add("top_k_5", [](SamplingParams& p) {
    p.top_k = 5;
    p.temperature = 1.3f;
  });
  add(
      "top_k_40",
      [](SamplingParams& p) {
        p.top_k = 40;
        p.temperature = 0.7f;
      },
      -1, 3);
  add("top_k_all", [](SamplingParams& p) { p.top_k = 100000; });
  add("top_p_90", [](SamplingParams& p) { p.top_p = 0.9f; });
  add("top_p_50", [](SamplingParams& p) {
    p.top_p = 0.5f;
    p.temperature = 1.7f;
  });
  add("top_k_top_p", [](SamplingParams& p) {
    p.top_k = 30;
    p.top_p = 0.6f;
  });
  add("min_p", [](SamplingParams& p) {
    p.min_p = 0.05f;
    p.temperature = 1.5f;
  });
  add("min_p_high", [](SamplingParams& p) { p.min_p = 0.3f; });
  add("min_p_top_p", [](SamplingParams& p) {
    p.min_p = 0.02f;
    p.top_p = 0.95f;
  });
  add("min_p_top_k", [](SamplingParams& p) {
    p.min_p = 0.1f;
    p.top_k = 20;
  });
  add(
      "all_penalties",
      [](SamplingParams& p) {
        p.temperature = 0.9f;
        p.top_k = 50;
        p.top_p = 0.9f;
        p.repetition_penalty = 1.3f;
        p.frequency_penalty = 0.5f;
        p.presence_penalty = -0.4f;
      },
      1, 4);
  add(
      "penalties_plain", [](SamplingParams& p) { p.repetition_penalty = 0.7f; }, 2);
  return cases;
}

// The device rows of `cases` for draw `step`.
std::vector<cuda::DeviceSamplingRow> DeviceRows(const std::vector<Case>& cases, uint64_t step) {
  const int R = cases.size();
  std::vector<cuda::DeviceSamplingRow> rows(R);
  for (int r = 0; r < R; ++r) {
    const SamplingParams& p = cases[r].params;
    cuda::DeviceSamplingRow& d = rows[r];
    d.logit_row = r;
    d.penalty_slot = cases[r].slot;
    cuda::SetSamplingParams(p, &d);  // as CudaBackend's Plan sets them
    d.top_logprobs = cases[r].top_n;
    d.want_logprob = cases[r].logprob;
    d.seed = 1000 + r;
    d.step = step;
  }
  return rows;
}

// Runs `rows` over `logits` on the device (`tokens`: the step's tokens, where verify rows
// find their drafts); returns the SampleResult bytes.
std::vector<uint8_t> RunDevice(const std::vector<cuda::DeviceSamplingRow>& rows,
                               const std::vector<float>& logits, int V,
                               const std::vector<PenaltyState>& slots,
                               const std::vector<int32_t>& tokens = {0}) {
  const int R = rows.size();
  std::vector<uint8_t> seen(slots.size() * V);
  std::vector<int32_t> counts(slots.size() * V);
  for (size_t s = 0; s < slots.size(); ++s) {
    for (int v = 0; v < V; ++v) {
      seen[s * V + v] = slots[s].seen(v);
      counts[s * V + v] = slots[s].count(v);
    }
  }
  DeviceBuffer<float> dlogits(logits), work(static_cast<size_t>(R) * V);
  DeviceBuffer<uint8_t> dseen(seen);
  DeviceBuffer<int32_t> dcounts(counts), dtokens(tokens);
  DeviceBuffer<uint8_t> drows(
      std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(rows.data()),
                           reinterpret_cast<const uint8_t*>(rows.data() + R)));
  DeviceBuffer<uint8_t> dres(sizeof(cuda::SampleResult) * R);
  cuda::SampleParams sp;
  sp.num_rows = R;
  sp.vocab = V;
  sp.logits = dlogits.get();
  sp.rows = reinterpret_cast<const cuda::DeviceSamplingRow*>(drows.get());
  sp.tokens = dtokens.get();
  sp.seen = dseen.get();
  sp.counts = dcounts.get();
  sp.work = work.get();
  sp.results = reinterpret_cast<cuda::SampleResult*>(dres.get());
  EXPECT_TRUE(CudaOk(cuda::LaunchSample(sp, nullptr)));
  return dres.ToHost();
}

// Runs `cases` (one row each, over `logits` rows) with draw `step`, checks against the host.
void CheckAgainstHost(const std::vector<Case>& cases, const std::vector<float>& logits, int V,
                      uint64_t step, const std::vector<PenaltyState>& slots) {
  const int R = cases.size();
  const std::vector<cuda::DeviceSamplingRow> rows = DeviceRows(cases, step);
  const std::vector<uint8_t> res_bytes = RunDevice(rows, logits, V, slots);
  ASSERT_EQ(res_bytes.size(), sizeof(cuda::SampleResult) * R);
  const auto* res = reinterpret_cast<const cuda::SampleResult*>(res_bytes.data());

  SamplerScratch scratch;
  for (int r = 0; r < R; ++r) {
    const Case& c = cases[r];
    const auto row = absl::MakeConstSpan(logits).subspan(static_cast<size_t>(r) * V, V);
    const int32_t want = SampleToken(row, c.params, rows[r].seed, step,
                                     c.slot >= 0 ? &slots[c.slot] : nullptr, &scratch);
    EXPECT_EQ(res[r].token, want) << c.name << " step " << step;
    if (want < 0) {  // logits not finite: nothing drawn, no alternatives
      for (int k = 0; k < cuda::kSampleMaxTop; ++k) EXPECT_EQ(res[r].top_tokens[k], -1);
      continue;
    }
    std::vector<TopLogprob> top;
    const float lp = ComputeLogprobs(row, res[r].token, c.top_n, &top);
    EXPECT_NEAR(res[r].logprob, lp, 1e-4) << c.name;
    for (int k = 0; k < c.top_n; ++k) {
      EXPECT_EQ(res[r].top_tokens[k], top[k].token) << c.name << " top " << k;
      EXPECT_NEAR(res[r].top_logprobs[k], top[k].logprob, 1e-4) << c.name << " top " << k;
    }
  }
}

std::vector<PenaltyState> MakeSlots(int V) {
  std::vector<PenaltyState> slots(3, PenaltyState(V));
  std::vector<int32_t> prompt, generated;
  for (int i = 0; i < 60; ++i) prompt.push_back((i * 37) % V);
  for (int i = 0; i < 40; ++i) generated.push_back((i * i * 11 + 5) % 97);
  slots[0].Reset(prompt, generated);
  slots[1].Reset(generated, prompt);
  slots[2].Reset(prompt, {});
  return slots;
}

TEST(DeviceSamplerTest, MatchesHostOnRandomLogits) {
  const int V = 1000;
  const std::vector<Case> cases = Cases();
  const std::vector<PenaltyState> slots = MakeSlots(V);
  for (uint64_t step = 0; step < 6; ++step) {
    std::vector<float> logits = RandomVector(cases.size() * V, 100 + step, -4, 4);
    // A peaked distribution on some rows (the usual shape of a language model's output).
    for (size_t r = 0; r < cases.size(); r += 2) {
      for (int i = 0; i < 12; ++i) logits[r * V + (i * 83 + step) % V] += 6 + i * 0.5f;
    }
    CheckAgainstHost(cases, logits, V, step, slots);
  }
}

#if defined(DCF_CUDA_SIM)
// Seeded sampling repeats whatever order the GPU runs the threads in: the same results, bit
// for bit (tokens, logprobs, alternatives), under every emulator schedule. The radix
// histograms' masses add in fixed point (sampling.cu, MassFixed): with floating-point
// atomics their order changed a bucket's mass in the last bits.
TEST(DeviceSamplerTest, SameResultsUnderEverySchedule) {
  const int V = 3000;
  const std::vector<Case> cases = Cases();
  const std::vector<PenaltyState> slots = MakeSlots(V);
  const simt::Schedule saved = simt::GetSchedule();
  for (uint64_t step = 0; step < 3; ++step) {
    std::vector<float> logits = RandomVector(cases.size() * V, 500 + step, -6, 6);
    const std::vector<cuda::DeviceSamplingRow> rows = DeviceRows(cases, step);
    std::vector<uint8_t> first;
    for (const char* name : {"linear", "reverse", "random:1", "random:2"}) {
      simt::Schedule schedule;
      ASSERT_TRUE(simt::ParseSchedule(name, &schedule));
      simt::SetSchedule(schedule);
      const std::vector<uint8_t> got = RunDevice(rows, logits, V, slots);
      if (first.empty()) {
        first = got;
      } else {
        EXPECT_TRUE(got == first) << name << " step " << step;
      }
    }
  }
  simt::SetSchedule(saved);
}
#endif

TEST(DeviceSamplerTest, ResolvesExactTiesByLowestId) {
  const int V = 700;
  const std::vector<Case> cases = Cases();
  const std::vector<PenaltyState> slots = MakeSlots(V);
  for (uint64_t step = 0; step < 4; ++step) {
    // Logits on a coarse grid: many exact ties, including at every top-k / top-p boundary.
    std::vector<float> logits = RandomVector(cases.size() * V, 200 + step, -3, 3);
    for (float& l : logits) l = std::round(l * 2) / 2;
    CheckAgainstHost(cases, logits, V, step, slots);
  }
  // All logits equal.
  CheckAgainstHost(cases, std::vector<float>(cases.size() * V, 0.25f), V, 7, slots);
}

// A row holding a NaN or an infinity draws nothing (token -1) on both samplers, whatever its
// sampling parameters; the other rows of the same launch are sampled as usual.
TEST(DeviceSamplerTest, NonFiniteRowsDrawNothing) {
  const int V = 500;
  const std::vector<Case> cases = Cases();
  const std::vector<PenaltyState> slots = MakeSlots(V);
  std::vector<float> logits = RandomVector(cases.size() * V, 400, -4, 4);
  const float bad[] = {NAN, INFINITY, -INFINITY};
  int corrupted = 0;
  for (size_t r = 0; r < cases.size(); r += 2, ++corrupted) {
    logits[r * V + (r * 37) % V] = bad[corrupted % 3];
  }
  SamplerScratch scratch;
  int undrawn = 0;
  for (size_t r = 0; r < cases.size(); ++r) {
    const auto row = absl::MakeConstSpan(logits).subspan(r * V, V);
    const int32_t t = SampleToken(row, cases[r].params, 1, 2,
                                  cases[r].slot >= 0 ? &slots[cases[r].slot] : nullptr, &scratch);
    undrawn += t < 0;
    EXPECT_EQ(t < 0, r % 2 == 0) << cases[r].name;
  }
  EXPECT_EQ(undrawn, corrupted);
  CheckAgainstHost(cases, logits, V, 2, slots);  // the device agrees, row by row
}

TEST(DeviceSamplerTest, FullVocabularyRows) {
  const int V = 50257;  // GPT-NeoX / DCFormer vocabulary
  std::vector<Case> cases = Cases();
  cases.resize(4);  // greedy, greedy with penalties, temperature (id order), hot
  Case p;
  p.name = "top_p_full";
  p.params.temperature = 0.7f;
  p.params.top_p = 0.95f;
  p.top_n = 20;
  cases.push_back(p);
  const std::vector<PenaltyState> slots = MakeSlots(V);
  std::vector<float> logits = RandomVector(cases.size() * V, 300, -8, 8);
  CheckAgainstHost(cases, logits, V, 3, slots);
}

// Verification (speculative decoding): a sequence's k + 1 rows sampled in one launch, row j
// with draw step + j and penalties counting the j drafts before it, must each be what the
// host samples at that position of plain decoding (the slot after the drafts before it were
// recorded one by one). Drafts repeat ids and hit ids the slot already saw, and the logits
// make the penalised ids matter (greedy rows would pick a draft id without its count).
TEST(DeviceSamplerTest, VerifyRowsCountTheDraftsBeforeThem) {
  const int V = 800;
  std::vector<Case> cases;
  for (const Case& c : Cases()) {
    if (c.slot >= 0 || c.name == "top_k_5" || c.name == "temperature") cases.push_back(c);
  }
  Case neg;  // negative penalties: each draft occurrence pulls its id up
  neg.name = "negative_penalties";
  neg.params.temperature = 1.2f;
  neg.params.top_k = 3;
  neg.params.presence_penalty = -1.0f;
  neg.params.frequency_penalty = -0.75f;
  neg.slot = 2;
  neg.top_n = 2;
  cases.push_back(neg);
  const std::vector<PenaltyState> slots = MakeSlots(V);
  const int n = 6;  // k = 5 drafts per sequence
  for (uint64_t step = 0; step < 3; ++step) {
    // One sequence per case; a shared slot is fine here (no row records).
    std::vector<int32_t> tokens;  // the step's tokens: per sequence its k drafts
    std::vector<cuda::DeviceSamplingRow> rows;
    std::vector<std::vector<int32_t>> drafts(cases.size());
    std::vector<float> logits = RandomVector(cases.size() * n * V, 900 + step, -3, 3);
    for (size_t c = 0; c < cases.size(); ++c) {
      // Ids the logits favour, so that penalties on them change the choice.
      const int32_t hot[] = {static_cast<int32_t>((c * 97 + step) % V), 5, 37, 74};
      for (int d = 0; d < n - 1; ++d) drafts[c].push_back(hot[(d * 3 + c) % 4]);
      for (int j = 0; j < n; ++j) {
        for (int32_t h : hot) logits[(c * n + j) * V + h] += 4.0f;
      }
      const cuda::DeviceSamplingRow base = DeviceRows({cases[c]}, 0)[0];
      for (int j = 0; j < n; ++j) {
        cuda::DeviceSamplingRow r = base;
        r.logit_row = static_cast<int32_t>(c * n + j);
        r.seed = 77 + c;
        r.step = step * 10 + j;
        r.seq_rows = n;
        r.draft_index = j;
        r.drafts = static_cast<int32_t>(tokens.size());
        rows.push_back(r);
      }
      tokens.insert(tokens.end(), drafts[c].begin(), drafts[c].end());
    }
    const std::vector<uint8_t> bytes = RunDevice(rows, logits, V, slots, tokens);
    const auto* res = reinterpret_cast<const cuda::SampleResult*>(bytes.data());
    SamplerScratch scratch;
    int penalised_differs = 0;  // rows where the drafts' counts changed the host's token
    for (size_t c = 0; c < cases.size(); ++c) {
      const Case& cs = cases[c];
      PenaltyState state = cs.slot >= 0 ? slots[cs.slot] : PenaltyState(V);
      for (int j = 0; j < n; ++j) {
        const auto row = absl::MakeConstSpan(logits).subspan((c * n + j) * V, V);
        const int32_t want =
            SampleToken(row, cs.params, 77 + c, step * 10 + j, &state, &scratch);
        if (cs.slot >= 0) {
          const int32_t without = SampleToken(row, cs.params, 77 + c, step * 10 + j,
                                              &slots[cs.slot], &scratch);
          penalised_differs += without != want;
        }
        const cuda::SampleResult& got = res[c * n + j];
        EXPECT_EQ(got.token, want) << cs.name << " step " << step << " row " << j;
        std::vector<TopLogprob> top;
        EXPECT_NEAR(got.logprob, ComputeLogprobs(row, want, cs.top_n, &top), 1e-4) << cs.name;
        for (int k = 0; k < cs.top_n; ++k) EXPECT_EQ(got.top_tokens[k], top[k].token) << cs.name;
        if (j + 1 < n) state.Record(drafts[c][j]);
      }
    }
    EXPECT_GT(penalised_differs, 0) << "the drafts' penalties never mattered: a weak test";
  }
}

// The penalty update of verify rows: in order, up to and including the first row that
// differs from its draft, and nothing from a row that drew nothing (or after it).
TEST(DeviceSamplerTest, RecordsAVerifiedSequenceUpToItsFirstMismatch) {
  const int V = 32;
  std::vector<uint8_t> seen(4 * V, 0);
  std::vector<int32_t> counts(4 * V, 0);
  // The step's tokens: sequence A drafts [7, 7, 9], B [2, 5], C [4, 4].
  const std::vector<int32_t> tokens = {1, 7, 7, 9, 3, 2, 5, 6, 4, 4};
  struct Seq {
    int slot, drafts;
    std::vector<int32_t> sampled;
  };
  const std::vector<Seq> seqs = {
      {0, 1, {7, 7, 3, 11}},  // A: accepts 7, 7, then 3 differs from 9: records 7, 7, 3
      {1, 5, {2, 5, 8}},      // B: accepts both drafts and the bonus 8
      {2, 8, {-1, 4, 4}},     // C: nothing drawn at row 0: records nothing
      {3, 8, {9, 4, 4}},      // D: the first row differs: records 9 only
      {-1, 8, {4, 4, 1}},     // E: no slot
  };
  std::vector<cuda::DeviceSamplingRow> rows;
  std::vector<cuda::SampleResult> results;
  for (const Seq& q : seqs) {
    const int n = static_cast<int>(q.sampled.size());
    for (int j = 0; j < n; ++j) {
      cuda::DeviceSamplingRow r;
      r.penalty_slot = q.slot;
      r.seq_rows = n;
      r.draft_index = j;
      r.drafts = q.drafts;
      rows.push_back(r);
      cuda::SampleResult res{};
      res.token = q.sampled[j];
      results.push_back(res);
    }
  }
  auto bytes = [](const auto& v) {
    using T = typename std::decay_t<decltype(v)>::value_type;
    return std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(v.data()),
                                reinterpret_cast<const uint8_t*>(v.data()) + v.size() * sizeof(T));
  };
  DeviceBuffer<uint8_t> dseen(seen), drows(bytes(rows)), dres(bytes(results));
  DeviceBuffer<int32_t> dcounts(counts), dtokens(tokens);
  cuda::RecordSampledParams p;
  p.num_rows = static_cast<int>(rows.size());
  p.vocab = V;
  p.rows = reinterpret_cast<const cuda::DeviceSamplingRow*>(drows.get());
  p.tokens = dtokens.get();
  p.results = reinterpret_cast<const cuda::SampleResult*>(dres.get());
  p.seen = dseen.get();
  p.counts = dcounts.get();
  ASSERT_TRUE(CudaOk(cuda::LaunchRecordSampled(p, nullptr)));
  const std::vector<uint8_t> s = dseen.ToHost();
  const std::vector<int32_t> c = dcounts.ToHost();
  std::vector<PenaltyState> want(4, PenaltyState(V));
  for (int32_t t : {7, 7, 3}) want[0].Record(t);
  for (int32_t t : {2, 5, 8}) want[1].Record(t);
  want[3].Record(9);
  for (int slot = 0; slot < 4; ++slot) {
    for (int v = 0; v < V; ++v) {
      EXPECT_EQ(c[slot * V + v], want[slot].count(v)) << "slot " << slot << " id " << v;
      EXPECT_EQ(s[slot * V + v] != 0, want[slot].seen(v)) << "slot " << slot << " id " << v;
    }
  }
}

TEST(DeviceSamplerTest, RecordsSampledTokensInTheirSlots) {
  const int V = 64;
  std::vector<uint8_t> seen(2 * V, 0);
  std::vector<int32_t> counts(2 * V, 0);
  counts[1 * V + 5] = 2;
  seen[1 * V + 5] = 1;
  std::vector<cuda::DeviceSamplingRow> rows(3);
  rows[0].penalty_slot = 1;
  rows[1].penalty_slot = -1;
  rows[2].penalty_slot = 0;
  std::vector<cuda::SampleResult> results(3);
  results[0].token = 5;
  results[1].token = 9;
  results[2].token = 63;
  auto bytes = [](const auto& v) {
    using T = typename std::decay_t<decltype(v)>::value_type;
    return std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(v.data()),
                                reinterpret_cast<const uint8_t*>(v.data()) + v.size() * sizeof(T));
  };
  DeviceBuffer<uint8_t> dseen(seen), drows(bytes(rows)), dres(bytes(results));
  DeviceBuffer<int32_t> dcounts(counts);
  cuda::RecordSampledParams p;
  p.num_rows = 3;
  p.vocab = V;
  p.rows = reinterpret_cast<const cuda::DeviceSamplingRow*>(drows.get());
  p.results = reinterpret_cast<const cuda::SampleResult*>(dres.get());
  p.seen = dseen.get();
  p.counts = dcounts.get();
  ASSERT_TRUE(CudaOk(cuda::LaunchRecordSampled(p, nullptr)));
  const std::vector<uint8_t> s = dseen.ToHost();
  const std::vector<int32_t> c = dcounts.ToHost();
  EXPECT_EQ(c[1 * V + 5], 3);
  EXPECT_EQ(s[1 * V + 5], 1);
  EXPECT_EQ(c[0 * V + 63], 1);
  EXPECT_EQ(s[0 * V + 63], 1);
  int total = 0;
  for (int32_t x : c) total += x;
  EXPECT_EQ(total, 4);  // row 1 has no slot: nothing recorded for token 9
}

}  // namespace
}  // namespace dcf::cuda_test
