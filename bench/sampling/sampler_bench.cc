// dcformer-sampler-bench: time per sampled token of the host sampler
// (engine/sampling/token_sampler.h, O(V)) against the full-sort sampler it replaced
// (tests/testing/reference_sampler.h), over logit shapes that stress top-p / top-k / min-p:
// a flat distribution (the nucleus is half the vocabulary), random normal logits, and a
// peaked one.
//
//   dcformer-sampler-bench [--vocab 50257 --min_seconds 0.3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "engine/common/flag_names.h"
#include "engine/sampling/token_sampler.h"
#include "tests/testing/reference_sampler.h"

ABSL_FLAG(int, vocab, 50257, "vocabulary size V");
ABSL_FLAG(double, min_seconds, 0.3, "minimum time per case and sampler");

namespace dcf {
namespace {

// Median milliseconds per call of fn(step) over at least min_seconds.
double MedianMs(const std::function<void(uint64_t)>& fn) {
  std::vector<double> ms;
  double spent = 0;
  for (uint64_t step = 0; spent < absl::GetFlag(FLAGS_min_seconds) * 1e3 || ms.size() < 5; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    fn(step);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    spent += ms.back();
  }
  std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
  return ms[ms.size() / 2];
}

int Main() {
  const int V = absl::GetFlag(FLAGS_vocab);
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0, 1);
  struct Shape {
    std::string name;
    std::vector<float> logits;
  };
  std::vector<Shape> shapes = {{"flat", std::vector<float>(V, 0.0f)}};
  std::vector<float> l(V);
  for (float& v : l) v = 3 * normal(rng);
  shapes.push_back({"normal(0,3)", l});
  for (float& v : l) v = 12 * normal(rng);
  shapes.push_back({"peaked", l});
  struct Setting {
    std::string name;
    SamplingParams p;
  };
  std::vector<Setting> settings;
  const auto add = [&](std::string name, int top_k, float top_p, float min_p) {
    SamplingParams p;
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    settings.push_back({std::move(name), p});
  };
  add("temperature 1", 0, 1.0f, 0.0f);
  add("top_p 0.9", 0, 0.9f, 0.0f);
  add("top_p 0.99", 0, 0.99f, 0.0f);
  add("top_k 50", 50, 1.0f, 0.0f);
  add("top_k 40000", 40000, 1.0f, 0.0f);
  add("top_k 50, top_p 0.9", 50, 0.9f, 0.0f);
  add("min_p 0.05", 0, 1.0f, 0.05f);
  add("top_p 0.95, min_p 0.05", 0, 0.95f, 0.05f);

  std::printf("V = %d; median ms per sampled token\n", V);
  std::printf("%-12s %-24s %10s %12s %8s\n", "logits", "setting", "O(V)", "full sort", "speedup");
  SamplerScratch scratch;
  testing::ReferenceSamplerScratch ref_scratch;
  for (const Shape& sh : shapes) {
    for (const Setting& st : settings) {
      const double ours = MedianMs([&](uint64_t step) {
        SampleToken(sh.logits, st.p, 7, step, nullptr, &scratch);
      });
      const double ref = MedianMs([&](uint64_t step) {
        testing::ReferenceSampleToken(sh.logits, st.p, 7, step, nullptr, &ref_scratch);
      });
      std::printf("%-12s %-24s %10.3f %12.3f %7.1fx\n", sh.name.c_str(), st.name.c_str(), ours,
                  ref, ref / ours);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace dcf

int main(int argc, char** argv) {
  std::vector<std::string> arg_storage;
  const std::vector<char*> rest = dcf::ParseToolCommandLine(
      argc, argv, "times the host token sampler at a given vocabulary size\n  dcformer-sampler-bench [--vocab V] [--min-seconds S]", arg_storage);
  if (rest.size() > 1) {
    std::fprintf(stderr, "dcformer-sampler-bench: unexpected argument '%s' (--help lists the flags)\n",
                 rest[1]);
    return 2;
  }
  return dcf::Main();
}
