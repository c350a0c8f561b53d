#include "engine/sampling/token_sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "engine/sampling/philox.h"

namespace dcf {
namespace {

absl::Status FieldError(const char* field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("sampling.", field, ": ", what));
}

// Puts the k ids of `order` with the largest `values` first, sorted (ties: lower id first).
// A heap (partial_sort) is fastest for small k, nth_element + sorting the prefix for medium
// k; for large k one sort of (value, id) pairs, which avoids the indirect comparisons.
void SortPrefix(std::vector<int32_t>& order, int k, const std::vector<float>& values,
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

}  // namespace

absl::Status ValidateSamplingParams(const SamplingParams& p) {
  if (!std::isfinite(p.temperature) || p.temperature < 0) {
    return FieldError("temperature", absl::StrCat("must be finite and >= 0, got ", p.temperature));
  }
  if (p.top_k < 0) return FieldError("top_k", absl::StrCat("must be >= 0, got ", p.top_k));
  if (!(p.top_p > 0 && p.top_p <= 1)) {
    return FieldError("top_p", absl::StrCat("must be in (0, 1], got ", p.top_p));
  }
  if (!(p.min_p >= 0 && p.min_p <= 1)) {
    return FieldError("min_p", absl::StrCat("must be in [0, 1], got ", p.min_p));
  }
  if (!(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0)) {
    return FieldError("repetition_penalty",
                      absl::StrCat("must be finite and > 0, got ", p.repetition_penalty));
  }
  if (!(p.presence_penalty >= -2 && p.presence_penalty <= 2)) {
    return FieldError("presence_penalty",
                      absl::StrCat("must be in [-2, 2], got ", p.presence_penalty));
  }
  if (!(p.frequency_penalty >= -2 && p.frequency_penalty <= 2)) {
    return FieldError("frequency_penalty",
                      absl::StrCat("must be in [-2, 2], got ", p.frequency_penalty));
  }
  return absl::OkStatus();
}

void PenaltyState::Reset(absl::Span<const int32_t> prompt, absl::Span<const int32_t> generated) {
  std::fill(seen_.begin(), seen_.end(), 0);
  std::fill(counts_.begin(), counts_.end(), 0);
  const int V = static_cast<int>(seen_.size());
  for (int32_t t : prompt) {
    if (t >= 0 && t < V) seen_[t] = 1;
  }
  for (int32_t t : generated) Record(t);
}

void PenaltyState::Record(int32_t token) {
  if (token < 0 || token >= static_cast<int32_t>(seen_.size())) return;
  seen_[token] = 1;
  ++counts_[token];
}

void PenaltyState::Apply(const SamplingParams& params, absl::Span<float> l) const {
  const float r = params.repetition_penalty;
  const float pres = params.presence_penalty;
  const float freq = params.frequency_penalty;
  const bool rep = r != 1.0f;
  const bool counts = pres != 0.0f || freq != 0.0f;
  if (!rep && !counts) return;
  const int V = static_cast<int>(std::min(l.size(), seen_.size()));
  for (int i = 0; i < V; ++i) {
    if (rep && seen_[i]) l[i] = l[i] > 0 ? l[i] / r : l[i] * r;
    if (counts && counts_[i] > 0) l[i] -= pres + freq * static_cast<float>(counts_[i]);
  }
}

int32_t SampleToken(absl::Span<const float> raw_logits, const SamplingParams& params,
                    uint64_t seed, uint64_t step, const PenaltyState* penalties,
                    SamplerScratch* scratch) {
  std::vector<float>& work = scratch->work;
  work.assign(raw_logits.begin(), raw_logits.end());
  if (penalties != nullptr) penalties->Apply(params, absl::MakeSpan(work));
  if (params.temperature == 0.0f) return ArgMax(work);

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
    SortPrefix(order, n, work, scratch->pairs);
  } else if (params.top_p < 1.0f) {
    // Top-p without top-k: sort only a growing prefix until it holds mass p, instead of the
    // whole vocabulary (the nucleus is usually a few dozen ids out of ~50k).
    const double mx = *std::max_element(work.begin(), work.end());
    double total = 0;
    for (float v : work) total += std::exp(static_cast<double>(v) - mx);
    const double target = params.top_p * total;
    for (int k = std::min(V, 64);;) {
      SortPrefix(order, k, work, scratch->pairs);
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
      // Grow at least 4x; when the prefix holds little of the mass (a flat distribution),
      // jump straight to twice the size its density predicts.
      const double predicted = 2.0 * k * target / std::max(cum, 1e-300);
      k = static_cast<int>(std::min<double>(V, std::max<double>(4.0 * k, predicted)));
    }
    top_p_done = true;
  } else {
    // Only the maximum is needed in front (min-p reference).
    std::iter_swap(order.begin(), std::min_element(order.begin(), order.end(), by_logit));
  }
  const double mx = work[order[0]];
  probs.resize(n);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += probs[i] = std::exp(static_cast<double>(work[order[i]]) - mx);
  // probs is sorted descending whenever top-k or top-p sorted it.
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
    const double threshold = params.min_p * probs[0];  // probs[0] is the maximum
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

float ComputeLogprobs(absl::Span<const float> l, int32_t token, int top_n,
                      std::vector<TopLogprob>* top) {
  const float mx = *std::max_element(l.begin(), l.end());
  double sum = 0;
  for (float v : l) sum += std::exp(static_cast<double>(v) - mx);
  const double log_z = mx + std::log(sum);
  if (top != nullptr) top->clear();
  if (top_n > 0) {
    const int V = static_cast<int>(l.size());
    top_n = std::min(top_n, V);
    // One pass keeping the best top_n ids sorted (top_n <= kMaxTopLogprobs): no vocab-sized
    // buffer.
    const auto better = [&](int32_t a, int32_t b) {
      return l[a] > l[b] || (l[a] == l[b] && a < b);
    };
    std::vector<int32_t> best;
    best.reserve(top_n + 1);
    for (int32_t i = 0; i < V; ++i) {
      if (static_cast<int>(best.size()) == top_n && !better(i, best.back())) continue;
      best.insert(std::upper_bound(best.begin(), best.end(), i, better), i);
      if (static_cast<int>(best.size()) > top_n) best.pop_back();
    }
    for (int32_t id : best) top->push_back({id, static_cast<float>(l[id] - log_z)});
  }
  return static_cast<float>(l[token] - log_z);
}

int32_t ArgMax(absl::Span<const float> l) {
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(l.size()); ++i) {
    if (l[i] > l[best]) best = i;
  }
  return best;
}

}  // namespace dcf
