// The token sampler as it was before it became O(V) (engine/sampling/token_sampler.cc at
// 20add04): penalties, temperature, then top-k / top-p by sorting (a growing sorted prefix
// for top-p), min-p, and the inverse-CDF walk in sorted order. Kept verbatim as the
// reference the O(V) sampler is tested against, and as the "before" of
// dcformer-sampler-bench. Not for production use.
#pragma once

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "engine/sampling/philox.h"
#include "engine/sampling/sampling_params.h"
#include "engine/sampling/token_sampler.h"

namespace dcf::testing {

struct ReferenceSamplerScratch {
  std::vector<float> work;
  std::vector<int32_t> order;
  std::vector<double> probs;
  std::vector<std::pair<float, int32_t>> pairs;
};

// Puts the k ids of `order` with the largest `values` first, sorted (ties: lower id first).
inline void ReferenceSortPrefix(std::vector<int32_t>& order, int k,
                                const std::vector<float>& values,
                                std::vector<std::pair<float, int32_t>>& scratch) {
  const int V = static_cast<int>(order.size());
  const auto better = [&](int32_t a, int32_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  };
  if (k <= 1024) {
    std::partial_sort(order.begin(), order.begin() + k, order.end(), better);
  } else if (k < V / 4) {
    std::nth_element(order.begin(), order.begin() + k, order.end(), better);
    std::sort(order.begin(), order.begin() + k, better);
  } else {
    scratch.resize(V);
    for (int i = 0; i < V; ++i) scratch[i] = {-values[order[i]], order[i]};
    std::sort(scratch.begin(), scratch.end());
    for (int i = 0; i < V; ++i) order[i] = scratch[i].second;
  }
}

inline int32_t ReferenceSampleToken(absl::Span<const float> raw_logits,
                                    const SamplingParams& params, uint64_t seed, uint64_t step,
                                    const PenaltyState* penalties,
                                    ReferenceSamplerScratch* scratch) {
  std::vector<float>& work = scratch->work;
  work.assign(raw_logits.begin(), raw_logits.end());
  if (penalties != nullptr) penalties->Apply(params, absl::MakeSpan(work));
  if (params.Greedy()) return ArgMax(work);

  const int V = static_cast<int>(work.size());
  std::vector<int32_t>& order = scratch->order;
  std::vector<double>& probs = scratch->probs;
  const float inv_t = 1.0f / params.temperature;
  for (float& v : work) v *= inv_t;
  order.resize(V);
  std::iota(order.begin(), order.end(), 0);
  const auto by_logit = [&](int32_t a, int32_t b) {
    return work[a] > work[b] || (work[a] == work[b] && a < b);
  };
  int n = V;
  bool top_p_done = false;
  if (params.top_k > 0 && params.top_k < V) {
    n = params.top_k;
    ReferenceSortPrefix(order, n, work, scratch->pairs);
  } else if (params.top_p < 1.0f) {
    const double mx = *std::max_element(work.begin(), work.end());
    double total = 0;
    for (float v : work) total += std::exp(static_cast<double>(v) - mx);
    const double target = params.top_p * total;
    for (int k = std::min(V, 64);;) {
      ReferenceSortPrefix(order, k, work, scratch->pairs);
      double cum = 0;
      int keep = 0;
      for (int i = 0; i < k; ++i) {
        cum += std::exp(static_cast<double>(work[order[i]]) - mx);
        if (cum >= target) {
          keep = i + 1;
          break;
        }
      }
      if (keep > 0 || k == V) {
        n = keep > 0 ? keep : V;
        break;
      }
      const double predicted = 2.0 * k * target / std::max(cum, 1e-300);
      k = static_cast<int>(std::min<double>(V, std::max<double>(4.0 * k, predicted)));
    }
    top_p_done = true;
  } else {
    std::iter_swap(order.begin(), std::min_element(order.begin(), order.end(), by_logit));
  }
  const double mx = work[order[0]];
  probs.resize(n);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += probs[i] = std::exp(static_cast<double>(work[order[i]]) - mx);
  if (params.top_p < 1.0f && !top_p_done) {
    double cum = 0;
    int keep = n;
    for (int i = 0; i < n; ++i) {
      cum += probs[i] / sum;
      if (cum >= params.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
  }
  if (params.min_p > 0.0f) {
    const double threshold = params.min_p * probs[0];
    for (int i = 1; i < n; ++i) {
      if (probs[i] < threshold) probs[i] = 0;
    }
  }
  sum = 0;
  for (int i = 0; i < n; ++i) sum += probs[i];
  const double u = philox::Uniform(seed, step) * sum;
  double cum = 0;
  int32_t token = order[0];
  for (int i = 0; i < n; ++i) {
    if (probs[i] == 0) continue;
    cum += probs[i];
    token = order[i];
    if (u < cum) break;
  }
  return token;
}

}  // namespace dcf::testing
