#include "engine/serving/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"

namespace dcf {
namespace {

absl::Status FieldError(const char* field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("sampling.", field, " ", what));
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

int32_t ArgMaxLowest(absl::Span<const float> l) {
  int32_t best = 0;
  for (int32_t i = 1; i < static_cast<int32_t>(l.size()); ++i) {
    if (l[i] > l[best]) best = i;
  }
  return best;
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

Sampler::Sampler(const SamplingParams& params, absl::Span<const int32_t> prompt, int vocab_size)
    : params_(params),
      vocab_size_(vocab_size),
      seed_(params.seed.has_value() ? *params.seed : absl::Uniform<uint64_t>(absl::BitGen())),
      rng_(seed_),
      seen_(vocab_size, 0),
      counts_(vocab_size, 0) {
  for (int32_t t : prompt) {
    if (t >= 0 && t < vocab_size_) seen_[t] = 1;
  }
}

double Sampler::NextUniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

void Sampler::ApplyPenalties(absl::Span<float> l) const {
  const float r = params_.repetition_penalty;
  const float pres = params_.presence_penalty;
  const float freq = params_.frequency_penalty;
  const bool rep = r != 1.0f;
  const bool counts = pres != 0.0f || freq != 0.0f;
  if (!rep && !counts) return;
  for (int i = 0; i < vocab_size_; ++i) {
    if (rep && seen_[i]) l[i] = l[i] > 0 ? l[i] / r : l[i] * r;
    if (counts && counts_[i] > 0) l[i] -= pres + freq * static_cast<float>(counts_[i]);
  }
}

int32_t Sampler::Sample(absl::Span<const float> raw_logits) {
  work_.assign(raw_logits.begin(), raw_logits.end());
  ApplyPenalties(absl::MakeSpan(work_));
  int32_t token;
  if (params_.temperature == 0.0f) {
    token = ArgMaxLowest(work_);
  } else {
    const int V = vocab_size_;
    const float inv_t = 1.0f / params_.temperature;
    for (float& v : work_) v *= inv_t;
    order_.resize(V);
    std::iota(order_.begin(), order_.end(), 0);
    const auto by_logit = [&](int32_t a, int32_t b) {
      return work_[a] > work_[b] || (work_[a] == work_[b] && a < b);
    };
    int n = V;
    bool top_p_done = false;
    if (params_.top_k > 0 && params_.top_k < V) {
      n = params_.top_k;
      SortPrefix(order_, n, work_, pairs_);
    } else if (params_.top_p < 1.0f) {
      // Top-p without top-k: sort only a growing prefix until it holds mass p, instead of the
      // whole vocabulary (the nucleus is usually a few dozen ids out of ~50k).
      const double mx = *std::max_element(work_.begin(), work_.end());
      double total = 0;
      for (float v : work_) total += std::exp(static_cast<double>(v) - mx);
      const double target = params_.top_p * total;
      for (int k = std::min(V, 64);;) {
        SortPrefix(order_, k, work_, pairs_);
        double cum = 0;
        int keep = 0;
        for (int i = 0; i < k; ++i) {
          cum += std::exp(static_cast<double>(work_[order_[i]]) - mx);
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
      std::iter_swap(order_.begin(), std::min_element(order_.begin(), order_.end(), by_logit));
    }
    const double mx = work_[order_[0]];
    probs_.resize(n);
    double sum = 0;
    for (int i = 0; i < n; ++i) sum += probs_[i] = std::exp(static_cast<double>(work_[order_[i]]) - mx);
    // probs_ is sorted descending whenever top-k or top-p sorted it.
    if (params_.top_p < 1.0f && !top_p_done) {
      double cum = 0;
      int keep = n;
      for (int i = 0; i < n; ++i) {
        cum += probs_[i] / sum;
        if (cum >= params_.top_p) {
          keep = i + 1;
          break;
        }
      }
      n = keep;
    }
    if (params_.min_p > 0.0f) {
      const double threshold = params_.min_p * probs_[0];  // probs_[0] is the maximum
      for (int i = 1; i < n; ++i) {
        if (probs_[i] < threshold) probs_[i] = 0;
      }
    }
    sum = 0;
    for (int i = 0; i < n; ++i) sum += probs_[i];
    const double u = NextUniform() * sum;
    double cum = 0;
    token = order_[0];
    for (int i = 0; i < n; ++i) {
      if (probs_[i] == 0) continue;
      cum += probs_[i];
      token = order_[i];
      if (u < cum) break;
    }
  }
  if (token >= 0 && token < vocab_size_) {
    seen_[token] = 1;
    ++counts_[token];
  }
  return token;
}

void ComputeLogprobs(absl::Span<const float> l, int32_t token, int top_n, TokenOutput* out) {
  const float mx = *std::max_element(l.begin(), l.end());
  double sum = 0;
  for (float v : l) sum += std::exp(static_cast<double>(v) - mx);
  const double log_z = mx + std::log(sum);
  out->logprob = static_cast<float>(l[token] - log_z);
  out->top.clear();
  if (top_n <= 0) return;
  const int V = static_cast<int>(l.size());
  top_n = std::min(top_n, V);
  // One pass keeping the best top_n ids sorted (top_n <= 20): no vocab-sized buffer.
  const auto better = [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
  std::vector<int32_t> best;
  best.reserve(top_n + 1);
  for (int32_t i = 0; i < V; ++i) {
    if (static_cast<int>(best.size()) == top_n && !better(i, best.back())) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), i, better), i);
    if (static_cast<int>(best.size()) > top_n) best.pop_back();
  }
  for (int32_t id : best) out->top.push_back({id, static_cast<float>(l[id] - log_z)});
}

}  // namespace dcf
