#include "engine/sampling/token_sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "engine/sampling/exp_shifted.h"
#include "engine/sampling/philox.h"

namespace dcf {
namespace {

// False when any value is NaN or infinite (exponent bits all ones). One pass, kept out of
// SampleToken's body: folded into its copy loop, it changed how the loops after it were
// compiled and cost up to 18% on top_k 50 in dcformer-sampler-bench; this way ~0-5%.
__attribute__((noinline)) bool AllFinite(absl::Span<const float> v) {
  uint32_t nonfinite = 0;
  for (float x : v) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof(bits));
    nonfinite |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return nonfinite == 0;
}

absl::Status FieldError(const char* field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("sampling.", field, ": ", what));
}

// Order-preserving 32-bit key of a float: a > b (as floats, no NaN) iff Key(a) > Key(b),
// and a == b iff Key(a) == Key(b).
// The sampling order is (key descending, id ascending).
uint32_t Key(float v) {
  if (v == 0.0f) v = 0.0f;  // -0 and +0 compare equal: one key, ties broken by id
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return (u & 0x80000000u) != 0 ? ~u : u | 0x80000000u;
}

// Radix levels over the key, most significant first: (shift, bits).
constexpr int kLevels = 3;
constexpr int kShift[kLevels] = {21, 10, 0};
constexpr int kBits[kLevels] = {11, 11, 10};
constexpr int kBuckets = 1 << 11;
// Up to this top_k, an insertion pass beats the radix selection.
constexpr int kSmallTopK = 64;

// Number of leading key bits shared by every key in [lo, hi] (the levels they decide need
// no histogram).
int FirstLevel(uint32_t lo, uint32_t hi) {
  const uint32_t diff = lo ^ hi;
  for (int l = 0; l < kLevels; ++l) {
    if ((diff >> kShift[l]) != 0) return l;
  }
  return kLevels;
}

// The k-th element (0-based rank k - 1 < n) of the order among `keys` [n] (ids are the
// indices): its key, and how many elements with that key rank before it or are it.
struct KthKey {
  uint32_t key = 0;
  int ties_needed = 0;  // elements with `key` that are among the first k (lowest ids first)
};

KthKey SelectKth(const std::vector<uint32_t>& keys, int k, std::vector<int32_t>& counts,
                 std::vector<int32_t>& in_bucket) {
  uint32_t lo = ~0u, hi = 0;
  for (uint32_t key : keys) {
    lo = std::min(lo, key);
    hi = std::max(hi, key);
  }
  const int first = FirstLevel(lo, hi);
  if (first == kLevels) return {hi, k};  // every key is equal
  int above = 0;  // elements whose key ranks above the current bucket
  in_bucket.clear();
  for (int l = first; l < kLevels; ++l) {
    const int shift = kShift[l];
    const uint32_t mask = (1u << kBits[l]) - 1;
    counts.assign(kBuckets, 0);
    // The first level sees every key (they share the bits above it); later ones only the
    // bucket chosen so far.
    if (l == first) {
      for (uint32_t key : keys) ++counts[(key >> shift) & mask];
    } else {
      for (int32_t i : in_bucket) ++counts[(keys[i] >> shift) & mask];
    }
    int b = static_cast<int>(mask);
    for (; b > 0 && above + counts[b] < k; --b) above += counts[b];
    const auto in_b = [&](uint32_t key) { return static_cast<int>((key >> shift) & mask) == b; };
    if (l == first) {
      for (int32_t i = 0; i < static_cast<int32_t>(keys.size()); ++i) {
        if (in_b(keys[i])) in_bucket.push_back(i);
      }
    } else {
      int n = 0;
      for (int32_t i : in_bucket) {
        if (in_b(keys[i])) in_bucket[n++] = i;
      }
      in_bucket.resize(n);
    }
  }
  return {keys[in_bucket.front()], k - above};  // the last level leaves equal keys only
}

// Candidates of the sampling distribution: ids in ascending order with their keys and
// probabilities (relative to the maximum, double).
struct Candidates {
  std::vector<int32_t>& ids;
  std::vector<uint32_t>& keys;
  std::vector<double>& probs;
  int size() const { return static_cast<int>(ids.size()); }
  // Keeps the candidates for which keep(i) holds, in order.
  template <typename Keep>
  void Filter(Keep&& keep) {
    int n = 0;
    for (int i = 0; i < size(); ++i) {
      if (!keep(i)) continue;
      ids[n] = ids[i];
      keys[n] = keys[i];
      probs[n] = probs[i];
      ++n;
    }
    ids.resize(n);
    keys.resize(n);
    probs.resize(n);
  }
};

// The first candidate in the order (key desc, id asc) whose inclusive cumulative `weight`
// reaches `target` (cum >= target, or cum > target when `strict`), found without sorting:
// per radix level, the mass of each key bucket decides which bucket holds the crossing;
// inside the last bucket every key is equal and ids ascend. When rounding keeps the total
// short of the target, the last candidate with weight; -1 when no candidate has weight.
int FindByMass(const Candidates& c, const std::vector<double>& weight, double target,
               bool strict, std::vector<double>& mass, std::vector<int32_t>& in_bucket,
               std::vector<int32_t>& next) {
  const auto reached = [&](double cum) { return strict ? cum > target : cum >= target; };
  uint32_t lo = ~0u, hi = 0;
  for (uint32_t key : c.keys) {
    lo = std::min(lo, key);
    hi = std::max(hi, key);
  }
  in_bucket.resize(c.size());
  std::iota(in_bucket.begin(), in_bucket.end(), 0);
  double before = 0;  // weight of the candidates ordered before the current bucket
  for (int l = FirstLevel(lo, hi); l < kLevels && in_bucket.size() > 1; ++l) {
    const int shift = kShift[l];
    const uint32_t mask = (1u << kBits[l]) - 1;
    mass.assign(kBuckets, 0.0);
    for (int32_t i : in_bucket) mass[(c.keys[i] >> shift) & mask] += weight[i];
    int b = static_cast<int>(mask), last_nonempty = -1;
    for (; b >= 0; --b) {
      if (mass[b] == 0) continue;
      if (reached(before + mass[b])) break;
      before += mass[b];
      last_nonempty = b;
    }
    if (b < 0) {
      // The bucket sums stayed short of the target (rounding, or a target at the total):
      // the crossing, if any, is the last candidate with weight, in the last bucket.
      if (last_nonempty < 0) return -1;
      b = last_nonempty;
      before -= mass[b];
    }
    next.clear();
    for (int32_t i : in_bucket) {
      if (static_cast<int>((c.keys[i] >> shift) & mask) == b) next.push_back(i);
    }
    in_bucket.swap(next);
  }
  // Equal keys from here on (or one candidate): ascending ids.
  double cum = before;
  int last = -1;
  for (int32_t i : in_bucket) {
    if (weight[i] == 0) continue;
    cum += weight[i];
    last = i;
    if (reached(cum)) return i;
  }
  return last;  // the bucket's weight reached the target: its last candidate is the one
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
  if (!AllFinite(raw_logits)) return -1;
  std::vector<float>& work = scratch->work;
  work.assign(raw_logits.begin(), raw_logits.end());
  if (penalties != nullptr) penalties->Apply(params, absl::MakeSpan(work));
  if (params.Greedy()) return ArgMax(work);

  const int V = static_cast<int>(work.size());
  const float inv_t = 1.0f / params.temperature;
  for (float& v : work) v *= inv_t;
  const bool top_k = params.top_k > 0 && params.top_k < V;
  const bool top_p = params.top_p < 1.0f;

  if (!top_k && !top_p) {
    // Neither orders the candidates: the draw walks the maximum first, then the other ids
    // in ascending order, id 0 taking the maximum's place (O(V); the device sampler walks
    // the same way).
    int32_t best = 0;
    for (int32_t i = 1; i < V; ++i) {
      if (work[i] > work[best]) best = i;
    }
    const auto id_at = [&](int i) { return i == 0 ? best : i == best ? 0 : i; };
    std::vector<double>& probs = scratch->probs;
    probs.resize(V);
    double sum = ExpShifted(work.data(), V, work[best], probs.data());
    std::swap(probs[0], probs[best]);  // probs[i] belongs to id_at(i)
    if (params.min_p > 0.0f) {
      sum = 0;
      for (int i = 0; i < V; ++i) {
        if (i > 0 && probs[i] < params.min_p) probs[i] = 0;  // the maximum's p is 1
        sum += probs[i];
      }
    }
    const double u = philox::Uniform(seed, step) * sum;
    double cum = 0;
    int32_t token = best;
    for (int i = 0; i < V; ++i) {
      if (probs[i] == 0) continue;
      cum += probs[i];
      token = id_at(i);
      if (u < cum) break;
    }
    return token;
  }

  // Candidates in ascending id order: every id, or the top_k best (ties: lower ids).
  Candidates c{scratch->ids, scratch->keys, scratch->probs};
  c.keys.resize(V);
  float mx = work[0];
  for (int i = 0; i < V; ++i) {
    c.keys[i] = Key(work[i]);
    mx = std::max(mx, work[i]);
  }
  if (top_k && params.top_k <= kSmallTopK) {
    // A few best: one pass keeping them in a small sorted array (cheaper than the radix
    // passes), then back to id order.
    std::vector<int32_t>& best = scratch->bucket;
    best.clear();
    const int k = params.top_k;
    const auto better = [&](int32_t a, int32_t b) {
      return c.keys[a] > c.keys[b] || (c.keys[a] == c.keys[b] && a < b);
    };
    for (int32_t i = 0; i < V; ++i) {
      if (static_cast<int>(best.size()) == k && !better(i, best.back())) continue;
      best.insert(std::upper_bound(best.begin(), best.end(), i, better), i);
      if (static_cast<int>(best.size()) > k) best.pop_back();
    }
    std::sort(best.begin(), best.end());
    c.ids.assign(best.begin(), best.end());
    for (int i = 0; i < k; ++i) c.keys[i] = c.keys[c.ids[i]];
    c.keys.resize(k);
  } else if (top_k) {
    c.ids.resize(V);
    const KthKey kth = SelectKth(c.keys, params.top_k, scratch->counts, scratch->bucket);
    int ties = kth.ties_needed;
    int n = 0;
    for (int i = 0; i < V; ++i) {
      const uint32_t key = c.keys[i];
      if (key > kth.key || (key == kth.key && ties-- > 0)) {
        c.ids[n] = i;
        c.keys[n] = key;
        ++n;
      }
    }
    c.ids.resize(n);
    c.keys.resize(n);
  } else {
    c.ids.resize(V);
    std::iota(c.ids.begin(), c.ids.end(), 0);
  }
  const int n = c.size();
  c.probs.resize(n);
  double sum;
  if (n == V) {
    sum = ExpShifted(work.data(), V, mx, c.probs.data());
  } else {
    std::vector<float>& values = scratch->values;
    values.resize(n);
    for (int i = 0; i < n; ++i) values[i] = work[c.ids[i]];
    sum = ExpShifted(values.data(), n, mx, c.probs.data());
  }

  if (top_p) {
    // The smallest prefix of the order whose mass reaches p (of the top-k mass after top-k,
    // of the whole distribution otherwise); all candidates when rounding keeps the mass
    // just short of it.
    std::vector<double>& weight = scratch->weights;
    double target;
    if (top_k) {
      weight.resize(n);
      for (int i = 0; i < n; ++i) weight[i] = c.probs[i] / sum;
      target = params.top_p;
    } else {
      weight = c.probs;
      target = params.top_p * sum;  // every id is a candidate: sum is the total, in id order
    }
    const int b = FindByMass(c, weight, target, /*strict=*/false, scratch->mass,
                             scratch->bucket, scratch->next);
    if (b >= 0) {
      const uint32_t bkey = c.keys[b];
      const int32_t bid = c.ids[b];
      c.Filter([&](int i) { return c.keys[i] > bkey || (c.keys[i] == bkey && c.ids[i] <= bid); });
    }
  }
  if (params.min_p > 0.0f) {
    // The maximum's probability is exp(0) = 1, so the bound is min_p itself.
    c.Filter([&](int i) { return !(c.probs[i] < params.min_p); });
  }
  sum = 0;
  for (double p : c.probs) sum += p;
  const double u = philox::Uniform(seed, step) * sum;
  const int i = FindByMass(c, c.probs, u, /*strict=*/true, scratch->mass, scratch->bucket,
                           scratch->next);
  return c.ids[std::max(i, 0)];  // i < 0 only without weight, impossible: the max has p 1
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
