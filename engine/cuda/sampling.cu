#include <climits>

#include "engine/cuda/device_util.cuh"
#include "engine/cuda/sampling.h"
#include "engine/sampling/philox.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 256;
constexpr int kHistGroups = 8;  // warps 2g and 2g + 1 share histogram g (less contention)
constexpr unsigned kNone = 0xffffffffu;

// Shared-memory layout, one array per element type (cuda_compat.h: no raw pointers into
// shared memory, so helpers index these arrays at fixed offsets).
// unsigned:
constexpr int kUHist = 0;                            // [kHistGroups][kBins] counts
constexpr int kUBin = kUHist + kHistGroups * kBins;  // [kBins] counts of the level
constexpr int kUWarp = kUBin + kBins;                // [32] warp totals (scans)
constexpr int kUBcast = kUWarp + 32;                 // [4] broadcast
constexpr int kUSize = kUBcast + 4;
// unsigned long long:
constexpr int kQHist = 0;  // [kHistGroups][kBins] masses in fixed point (MassFixed)
constexpr int kQSize = kHistGroups * kBins;
// double:
constexpr int kDBin = 0;                             // [kBins] weights of the level
constexpr int kDWarp = kDBin + kBins;                // [32] reductions and scans
constexpr int kDBcast = kDWarp + 32;                 // [4]
constexpr int kDSize = kDBcast + 4;
// float:
constexpr int kFWarp = 0;   // [32]
constexpr int kFCand = 32;  // [kSampleMaxTop] candidate logits
constexpr int kFSize = kFCand + kSampleMaxTop;
// int:
constexpr int kIWarp = 0;                        // [32]
constexpr int kICand = 32;                       // [kSampleMaxTop] candidate ids
constexpr int kICount = kICand + kSampleMaxTop;  // [1] candidates gathered
constexpr int kIBcast = kICount + 1;             // [2]
constexpr int kISize = kIBcast + 2;

template <typename SU, typename SQ, typename SD, typename SF, typename SI>
struct Smem {
  SU& u;
  SQ& q;
  SD& d;
  SF& f;
  SI& i;
};
template <typename SU, typename SQ, typename SD, typename SF, typename SI>
__device__ Smem<SU, SQ, SD, SF, SI> MakeSmem(SU& u, SQ& q, SD& d, SF& f, SI& i) {
  return Smem<SU, SQ, SD, SF, SI>{u, q, d, f, i};
}

// The radix histograms' masses are sums of p = exp(v - max) in [0, 1] accumulated with
// atomics by whichever threads get there first. In floating point the order of those adds
// changes the last bits of a bucket's mass, and with it, at a top-p or sampling boundary, the
// token: seeded sampling would not repeat on a GPU. So the histograms add p in 40-bit fixed
// point with integer atomics (associative: the same sums in any order, and a native shared
// u64 add instead of a double add), exact for vocabularies below 2^23 (the sum stays below
// 2^63); a mass below 2^-41 counts as 0 there (its element is still counted and kept).
constexpr double kMassScale = 1099511627776.0;  // 2^40
__device__ __forceinline__ unsigned long long MassFixed(float p) {
  return static_cast<unsigned long long>(static_cast<double>(p) * kMassScale + 0.5);
}

// Order-preserving key: larger float -> larger key. -0 and +0 (equal values) share a key.
__device__ __forceinline__ uint32_t OrderKey(float v) {
  if (v == 0.0f) v = 0.0f;
  const uint32_t u = __float_as_uint(v);
  return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float KeyValue(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) != 0u ? (k & 0x7fffffffu) : ~k);
}

// Which elements are still candidates: a prefix of the order (value desc, id asc) ending at
// (bkey, bid), and probabilities of at least min_p (the maximum's probability is 1).
struct Filter {
  bool bounded = false;
  uint32_t bkey = 0;
  int bid = 0;
  float min_p = 0.0f;
  __device__ bool Keep(uint32_t key, int id, float p) const {
    if (bounded && (key < bkey || (key == bkey && id > bid))) return false;
    return !(min_p > 0.0f) || p >= min_p;
  }
};

template <typename S>
__device__ float BlockMax(float v, S& s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = dev::WarpMax(v);
  __syncthreads();
  if (lane == 0) s.f[kFWarp + warp] = v;
  __syncthreads();
  float r = lane < kWarps ? s.f[kFWarp + lane] : -INFINITY;
  return dev::WarpMax(r);
}

template <typename S>
__device__ double BlockSumD(double v, S& s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = dev::WarpSum(v);
  __syncthreads();
  if (lane == 0) s.d[kDWarp + warp] = v;
  __syncthreads();
  double r = lane < kWarps ? s.d[kDWarp + lane] : 0.0;
  return dev::WarpSum(r);
}

// The largest value, lowest id on ties (ids of INT_MAX mean "none").
__device__ __forceinline__ bool Better(float a, int ia, float b, int ib) {
  return a > b || (a == b && ia < ib);
}
template <typename S>
__device__ void BlockArgMax(float& v, int& id, S& s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(dev::kFullMask, v, o);
    const int oi = __shfl_xor_sync(dev::kFullMask, id, o);
    if (Better(ov, oi, v, id)) {
      v = ov;
      id = oi;
    }
  }
  __syncthreads();
  if (lane == 0) {
    s.f[kFWarp + warp] = v;
    s.i[kIWarp + warp] = id;
  }
  __syncthreads();
  v = lane < kWarps ? s.f[kFWarp + lane] : -INFINITY;
  id = lane < kWarps ? s.i[kIWarp + lane] : INT_MAX;
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(dev::kFullMask, v, o);
    const int oi = __shfl_xor_sync(dev::kFullMask, id, o);
    if (Better(ov, oi, v, id)) {
      v = ov;
      id = oi;
    }
  }
}

// Exclusive prefix sums over the block in thread order.
template <typename S>
__device__ unsigned BlockExclusiveScanU(unsigned c, S& s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned incl = c;
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned n = __shfl_up_sync(dev::kFullMask, incl, o);
    if (lane >= o) incl += n;
  }
  __syncthreads();
  if (lane == 31) s.u[kUWarp + warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const unsigned t = lane < kWarps ? s.u[kUWarp + lane] : 0u;
    unsigned ti = t;
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned n = __shfl_up_sync(dev::kFullMask, ti, o);
      if (lane >= o) ti += n;
    }
    __syncwarp();
    if (lane < kWarps) s.u[kUWarp + lane] = ti - t;
  }
  __syncthreads();
  return s.u[kUWarp + warp] + incl - c;
}
template <typename S>
__device__ double BlockExclusiveScanD(double c, S& s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  double incl = c;
  for (int o = 1; o < 32; o <<= 1) {
    const double n = __shfl_up_sync(dev::kFullMask, incl, o);
    if (lane >= o) incl += n;
  }
  __syncthreads();
  if (lane == 31) s.d[kDWarp + warp] = incl;
  __syncthreads();
  if (warp == 0) {
    const double t = lane < kWarps ? s.d[kDWarp + lane] : 0.0;
    double ti = t;
    for (int o = 1; o < 32; o <<= 1) {
      const double n = __shfl_up_sync(dev::kFullMask, ti, o);
      if (lane >= o) ti += n;
    }
    __syncwarp();
    if (lane < kWarps) s.d[kDWarp + lane] = ti - t;
  }
  __syncthreads();
  return s.d[kDWarp + warp] + incl - c;
}

// Sum of exp(v - mx) over the kept elements.
template <typename S>
__device__ double MassSum(const float* values, int V, const Filter& f, float mx, S& s) {
  double sum = 0;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float v = values[i];
    const float p = expf(v - mx);
    if (f.Keep(OrderKey(v), i, p)) sum += p;
  }
  return BlockSumD(sum, s);
}

// The id of the j-th (0-based, in id order) kept element whose key is `key`.
template <typename S>
__device__ int NthWithKey(const float* values, int V, const Filter& f, float p, uint32_t key, int j,
                          S& s) {
  const int seg = (V + blockDim.x - 1) / blockDim.x;
  const int lo = min(V, static_cast<int>(threadIdx.x) * seg), hi = min(V, lo + seg);
  unsigned c = 0;
  for (int i = lo; i < hi; ++i) c += OrderKey(values[i]) == key && f.Keep(key, i, p);
  const unsigned excl = BlockExclusiveScanU(c, s);
  if (threadIdx.x == 0) s.i[kIBcast] = -1;
  __syncthreads();
  if (excl <= static_cast<unsigned>(j) && static_cast<unsigned>(j) < excl + c) {
    unsigned n = j - excl;
    for (int i = lo; i < hi; ++i) {
      if (OrderKey(values[i]) == key && f.Keep(key, i, p)) {
        if (n == 0) {
          s.i[kIBcast] = i;
          break;
        }
        --n;
      }
    }
  }
  __syncthreads();
  const int id = s.i[kIBcast];
  __syncthreads();
  return id;
}

struct Found {
  uint32_t key;
  int id;  // -1: no element is kept
};

// Finds the first kept element x of the order (value desc, id asc) whose inclusive
// cumulative weight reaches `target` (weight 1 per element, or exp(v - mx) when kMass;
// `strict`: exceeds). When rounding leaves the target beyond the total, the last kept
// element. Radix search over the key: four passes of 8-bit digits.
template <bool kMass, typename S>
__device__ Found RadixSelect(const float* values, int V, const Filter& f, float mx, double target,
                             bool strict, S& s) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, group = warp >> 1;
  uint32_t prefix = 0, mask = 0;
  double before = 0;  // weight of kept elements ordered before the current bucket
  unsigned bucket_count = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kHistGroups * kBins; b += blockDim.x) {
      s.u[kUHist + b] = 0u;
      if (kMass) s.q[kQHist + b] = 0ull;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
      const float v = values[i];
      const uint32_t key = OrderKey(v);
      if ((key & mask) != prefix) continue;
      const float p = (kMass || f.min_p > 0.0f) ? expf(v - mx) : 0.0f;
      if (!f.Keep(key, i, p)) continue;
      const int bin = (key >> shift) & (kBins - 1);
      atomicAdd(&s.u[kUHist + group * kBins + bin], 1u);
      if (kMass) atomicAdd(&s.q[kQHist + group * kBins + bin], MassFixed(p));
    }
    __syncthreads();
    for (int b = threadIdx.x; b < kBins; b += blockDim.x) {
      unsigned c = 0;
      unsigned long long m = 0;
      for (int g = 0; g < kHistGroups; ++g) {
        c += s.u[kUHist + g * kBins + b];
        if (kMass) m += s.q[kQHist + g * kBins + b];
      }
      s.u[kUBin + b] = c;
      s.d[kDBin + b] = kMass ? static_cast<double>(m) / kMassScale : static_cast<double>(c);
    }
    __syncthreads();
    if (warp == 0) {
      // Lane L owns bins 255 - 8L - j, j = 0..7: descending order across the warp.
      double w[8];
      unsigned cnt[8];
      double tot = 0;
      for (int j = 0; j < 8; ++j) {
        const int b = kBins - 1 - 8 * lane - j;
        w[j] = s.d[kDBin + b];
        cnt[j] = s.u[kUBin + b];
        tot += w[j];
      }
      double incl = tot;
      for (int o = 1; o < 32; o <<= 1) {
        const double n = __shfl_up_sync(dev::kFullMask, incl, o);
        if (lane >= o) incl += n;
      }
      double cum = before + incl - tot;
      int pick = -1;
      double pick_before = 0;
      int last = -1;
      double last_before = 0;
      for (int j = 0; j < 8; ++j) {
        if (cnt[j] == 0) continue;
        const double next = cum + w[j];
        last = kBins - 1 - 8 * lane - j;
        last_before = cum;
        if (pick < 0 && (strict ? next > target : next >= target)) {
          pick = last;
          pick_before = cum;
        }
        cum = next;
      }
      const unsigned crossed = __ballot_sync(dev::kFullMask, pick >= 0);
      const unsigned nonempty = __ballot_sync(dev::kFullMask, last >= 0);
      if (crossed != 0u) {
        if (lane == __ffs(crossed) - 1) {
          s.u[kUBcast] = static_cast<unsigned>(pick);
          s.d[kDBcast] = pick_before;
        }
      } else if (nonempty != 0u) {
        if (lane == 31 - __clz(nonempty)) {
          s.u[kUBcast] = static_cast<unsigned>(last);
          s.d[kDBcast] = last_before;
        }
      } else if (lane == 0) {
        s.u[kUBcast] = kNone;
      }
    }
    __syncthreads();
    const unsigned bin = s.u[kUBcast];
    if (bin == kNone) return Found{0u, -1};  // uniform: every thread read the same value
    before = s.d[kDBcast];
    bucket_count = s.u[kUBin + bin];
    prefix |= bin << shift;
    mask |= 0xffu << shift;
    __syncthreads();  // the next level rewrites the histograms and the broadcast slots
  }
  // `prefix` is the boundary key; `before` the weight of the kept elements above it. Its
  // bucket_count elements have equal weight: the j-th of them (in id order) is the one.
  const float p = expf(KeyValue(prefix) - mx);
  const double last = static_cast<double>(bucket_count) - 1.0;
  double j;
  if (!kMass) {
    j = target - before - 1.0;
  } else if (p > 0.0f) {
    const double r = (target - before) / p;
    j = strict ? floor(r) : ceil(r) - 1.0;
  } else {
    j = last;
  }
  j = j < 0.0 ? 0.0 : (j > last ? last : j);
  return Found{prefix, NthWithKey(values, V, f, p, prefix, static_cast<int>(j), s)};
}

// The host's draw when neither top-k nor top-p ordered the candidates: the maximum `top`
// first (cumulative 1 = exp(0)), then every other id in ascending order, except that id 0
// takes the maximum's place (the host swaps them). The first position whose cumulative
// probability exceeds u wins; when rounding leaves none, the last one with mass.
template <typename S>
__device__ int DrawInIdOrder(const float* values, int V, const Filter& f, float mx, int top,
                             double u, S& s) {
  if (u < 1.0) return top;
  const double target = u - 1.0;
  // Positions 1 .. V-1; the element at position k is id (k == top ? 0 : k).
  const int n = V - 1;
  const int seg = (n + blockDim.x - 1) / blockDim.x;
  const int lo = 1 + min(n, static_cast<int>(threadIdx.x) * seg);
  const int hi = 1 + min(n, static_cast<int>(threadIdx.x) * seg + seg);
  double sum = 0;
  int last_pos = 0;  // position 0 (the maximum) always has mass
  for (int k = lo; k < hi; ++k) {
    const int id = k == top ? 0 : k;
    const float v = values[id];
    const float p = expf(v - mx);
    if (f.Keep(OrderKey(v), id, p) && p > 0.0f) {
      sum += p;
      last_pos = k;
    }
  }
  const double excl = BlockExclusiveScanD(sum, s);
  if (threadIdx.x == 0) {
    s.i[kIBcast] = INT_MAX;  // the winning position
    s.i[kIBcast + 1] = 0;
  }
  __syncthreads();
  // The scan's `excl` of one thread and `excl + sum` of the previous one are rounded
  // separately, so the ranges may overlap or leave a gap at the target. Every range that
  // ends beyond the target claims (a range starting beyond it claims its first position) and
  // claims go through atomicMin: the lowest claimed position wins whatever order threads
  // run in, and a gap resolves to the next range's first position. A range whose own
  // running sum, rounded differently, never passes the target claims its last position
  // with mass.
  if (sum > 0 && target < excl + sum) {
    double cum = excl;
    int pos = last_pos;
    for (int k = lo; k < hi; ++k) {
      const int id = k == top ? 0 : k;
      const float v = values[id];
      const float p = expf(v - mx);
      if (!(f.Keep(OrderKey(v), id, p) && p > 0.0f)) continue;
      cum += p;
      if (target < cum) {
        pos = k;
        break;
      }
    }
    atomicMin(&s.i[kIBcast], pos);
  }
  if (last_pos > 0) atomicMax(&s.i[kIBcast + 1], last_pos);
  __syncthreads();
  // No claim: rounding left the target beyond the total; the last position with mass.
  const int k = s.i[kIBcast] != INT_MAX ? s.i[kIBcast] : s.i[kIBcast + 1];
  const int id = k == 0 ? top : (k == top ? 0 : k);
  __syncthreads();
  return id;
}

__global__ void __launch_bounds__(kThreads) SampleKernel(SampleParams p) {
  DCF_SHARED(unsigned, su, kUSize);
  DCF_SHARED(unsigned long long, sq, kQSize);
  DCF_SHARED(double, sd, kDSize);
  DCF_SHARED(float, sf, kFSize);
  DCF_SHARED(int, si, kISize);
  auto s = MakeSmem(su, sq, sd, sf, si);
  const DeviceSamplingRow row = p.rows[blockIdx.x];
  const int V = p.vocab;
  const float* raw = p.logits + static_cast<int64_t>(row.logit_row) * V;
  float* work = p.work + static_cast<int64_t>(blockIdx.x) * V;
  const bool greedy = row.temperature == 0.0f;
  const int slot = row.penalty_slot;
  const bool rep = slot >= 0 && row.repetition_penalty != 1.0f;
  const bool cnt = slot >= 0 && (row.presence_penalty != 0.0f || row.frequency_penalty != 0.0f);
  const uint8_t* seen = rep ? p.seen + static_cast<int64_t>(slot) * V : nullptr;
  const int32_t* counts = cnt ? p.counts + static_cast<int64_t>(slot) * V : nullptr;
  // Row j of a verifying sequence: the j drafted tokens before it count as generated, as
  // they would in the slot had plain decoding accepted them one step at a time.
  const int num_drafts = (rep || cnt) ? row.draft_index : 0;
  const int32_t* drafts = num_drafts > 0 ? p.tokens + row.drafts : nullptr;  // [num_drafts]

  // 1. Penalties and temperature into `work`; the maxima of the raw and adjusted logits; any
  // NaN or infinity among the raw logits.
  float raw_max = -INFINITY, best = -INFINITY;
  int best_id = INT_MAX;
  float nonfinite = 0.0f;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float r = raw[i];
    if (isnan(r) || isinf(r)) nonfinite = 1.0f;
    raw_max = fmaxf(raw_max, r);
    float l = r;
    int extra = 0;  // occurrences among the drafts before this row
    for (int d = 0; d < num_drafts; ++d) extra += drafts[d] == i;
    if (rep && (seen[i] != 0 || extra > 0)) {
      l = l > 0 ? l / row.repetition_penalty : l * row.repetition_penalty;
    }
    if (cnt && counts[i] + extra > 0) {
      l -= row.presence_penalty + row.frequency_penalty * static_cast<float>(counts[i] + extra);
    }
    if (!greedy) l *= row.inv_temperature;
    work[i] = l;
    if (l > best) {  // ids ascend within a thread: the first maximum is the lowest id
      best = l;
      best_id = i;
    }
  }
  BlockArgMax(best, best_id, s);
  raw_max = BlockMax(raw_max, s);
  nonfinite = BlockMax(nonfinite, s);  // the same in every thread: the branch is uniform
  __syncthreads();  // work[] written by other threads is read below
  SampleResult* out = p.results + blockIdx.x;
  if (nonfinite > 0.0f) {  // as the host sampler: nothing is drawn, token -1
    if (threadIdx.x == 0) {
      out->token = -1;
      if (p.sampled != nullptr) p.sampled[blockIdx.x] = -1;
      out->logprob = 0.0f;
      for (int k = 0; k < kSampleMaxTop; ++k) {
        out->top_tokens[k] = -1;
        out->top_logprobs[k] = 0.0f;
      }
    }
    return;
  }

  // 2. The token (0 if no logit compares: all NaN).
  if (best_id == INT_MAX) best_id = 0;
  int token = best_id;
  if (!greedy) {
    const float mx = best;
    Filter f;
    const bool top_k = row.top_k > 0 && row.top_k < V;
    const bool top_p = row.top_p < 1.0f;
    if (top_k) {
      const Found b = RadixSelect<false>(work, V, f, mx, row.top_k, false, s);
      f.bounded = true;
      f.bkey = b.key;
      f.bid = b.id;
    }
    if (top_p) {
      const double total = MassSum(work, V, f, mx, s);
      const Found b =
          RadixSelect<true>(work, V, f, mx, static_cast<double>(row.top_p) * total, false, s);
      if (b.id >= 0) {
        f.bounded = true;
        f.bkey = b.key;
        f.bid = b.id;
      }
    }
    f.min_p = row.min_p;
    const double sum = MassSum(work, V, f, mx, s);
    const double u = philox::Uniform(row.seed, row.step) * sum;
    if (top_k || top_p) {
      const Found b = RadixSelect<true>(work, V, f, mx, u, true, s);
      if (b.id >= 0) token = b.id;
    } else {
      const int id = DrawInIdOrder(work, V, f, mx, best_id, u, s);
      if (id >= 0) token = id;
    }
  }

  // 3. Logprobs of the raw logits.
  const int top_n = min(row.top_logprobs, min(V, kSampleMaxTop));
  double lse = 0;
  if (row.want_logprob != 0 || top_n > 0) {
    double se = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) se += expf(raw[i] - raw_max);
    lse = static_cast<double>(raw_max) + log(BlockSumD(se, s));
  }
  if (top_n > 0) {
    const Found b = RadixSelect<false>(raw, V, Filter(), 0.0f, top_n, false, s);
    if (threadIdx.x == 0) s.i[kICount] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
      const uint32_t key = OrderKey(raw[i]);
      if (key > b.key || (key == b.key && i <= b.id)) {
        const int at = atomicAdd(&s.i[kICount], 1);
        if (at < kSampleMaxTop) {
          s.i[kICand + at] = i;
          s.f[kFCand + at] = raw[i];
        }
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    out->token = token;
    if (p.sampled != nullptr) p.sampled[blockIdx.x] = token;
    out->logprob = row.want_logprob != 0 || top_n > 0 ? static_cast<float>(raw[token] - lse) : 0.0f;
    int n = top_n > 0 ? min(s.i[kICount], top_n) : 0;
    // Insertion sort of the n candidates: value desc, id asc.
    for (int a = 1; a < n; ++a) {
      const int id = s.i[kICand + a];
      const float v = s.f[kFCand + a];
      int b = a - 1;
      while (b >= 0 && Better(v, id, s.f[kFCand + b], s.i[kICand + b])) {
        s.i[kICand + b + 1] = s.i[kICand + b];
        s.f[kFCand + b + 1] = s.f[kFCand + b];
        --b;
      }
      s.i[kICand + b + 1] = id;
      s.f[kFCand + b + 1] = v;
    }
    for (int k = 0; k < kSampleMaxTop; ++k) {
      out->top_tokens[k] = k < n ? s.i[kICand + k] : -1;
      out->top_logprobs[k] = k < n ? static_cast<float>(s.f[kFCand + k] - lse) : 0.0f;
    }
  }
}

// One thread per sequence (its first row): slots are distinct across sequences
// (ValidateStepBatch), and a verifying sequence's rows are recorded in order.
__global__ void RecordSampledKernel(RecordSampledParams p) {
  for (int r = threadIdx.x; r < p.num_rows; r += blockDim.x) {
    const DeviceSamplingRow& first = p.rows[r];
    if (first.draft_index != 0 || first.penalty_slot < 0) continue;
    const int64_t base = static_cast<int64_t>(first.penalty_slot) * p.vocab;
    for (int j = 0; j < first.seq_rows && r + j < p.num_rows; ++j) {
      const int token = p.results[r + j].token;
      if (token < 0 || token >= p.vocab) break;  // nothing drawn: no later row counts
      p.seen[base + token] = 1;
      atomicAdd(&p.counts[base + token], 1);
      if (j + 1 < first.seq_rows && token != p.tokens[first.drafts + j]) break;
    }
  }
}

}  // namespace

cudaError_t LaunchSample(const SampleParams& p, cudaStream_t stream) {
  if (p.num_rows <= 0) return cudaSuccess;
  if (p.vocab <= 0 || p.vocab >= (1 << 23) || p.logits == nullptr || p.rows == nullptr || p.work == nullptr ||
      p.results == nullptr) {
    return cudaErrorInvalidValue;
  }
  DCF_LAUNCH(SampleKernel, p.num_rows, kThreads, 0, stream, p);
  return cudaGetLastError();
}

cudaError_t LaunchRecordSampled(const RecordSampledParams& p, cudaStream_t stream) {
  if (p.num_rows <= 0 || p.seen == nullptr) return cudaSuccess;
  DCF_LAUNCH(RecordSampledKernel, 1, 256, 0, stream, p);
  return cudaGetLastError();
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
