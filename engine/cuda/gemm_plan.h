// The bookkeeping of Gemm's plans (gemm.h), kept apart from the library so that it is pure
// host logic, the same in both builds and unit-tested without a GPU (gemm_plan_test):
//
// - m buckets. A plan serves every m of its bucket: bucket b holds m in (2^(b-1), 2^b]
//   (bucket 0 is m = 1), so a model whose steps have at most T rows has ceil(log2 T) + 1
//   buckets per product shape, and a new prefill length never needs a plan of its own. The
//   product runs with its real m inside the bucket's plan (cuBLASLt: the layouts' column
//   count is an attribute set per call, not a new descriptor).
// - Candidate choice. At Prepare, each bucket's heuristic candidates are checked at both
//   ends of the bucket and timed; PickFastestCandidate keeps the fastest usable one.
// - A bounded cache. Plans made at Prepare are pinned (their number is fixed by the model's
//   product shapes and the step limits); a product that was not prepared (another shape, an
//   m past the limits) gets a plan built on first use, kept in an LRU of at most
//   `lru_capacity` plans.
//
// Not thread-safe (one owner, like Gemm).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "engine/simt/cuda_compat.h"
#include "engine/cuda/dcmha_attention.h"  // ElemType

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {

struct GemmArgs;  // gemm.h

// The bucket of m >= 1, and the m range [GemmBucketLo(b), GemmBucketHi(b)] it holds.
int GemmBucketOf(int m);
int GemmBucketLo(int bucket);
int GemmBucketHi(int bucket);

// The buckets that products of min_m..max_m rows fall in, ascending (empty if min_m > max_m).
std::vector<int> GemmBucketsFor(int min_m, int max_m);

// The largest power of two (<= 256) dividing the address: the alignment a plan may assume.
uint32_t GemmAlignmentOf(const void* p);

// Everything but the exact m that selects a plan: m's bucket, shape, strides, dtype, FP8
// operands, epilogue, accumulation and the operands' alignments. The library only runs dense
// products and the FP8 products of gemm_quant.h (`fp8`: x and w E4M3 codes).
struct GemmPlanKey {
  int bucket = 0;
  int n = 0, k = 0;
  int64_t ldx = 0, ldy = 0;
  ElemType dtype = ElemType::kF32;
  bool fp8 = false;
  bool bias = false;
  bool accumulate = false;
  uint32_t align_x = 0, align_w = 0, align_y = 0;

  auto Tie() const {
    return std::tie(bucket, n, k, ldx, ldy, dtype, fp8, bias, accumulate, align_x, align_w,
                    align_y);
  }
  bool operator<(const GemmPlanKey& o) const { return Tie() < o.Tie(); }
  bool operator==(const GemmPlanKey& o) const { return Tie() == o.Tie(); }
};

// The key of the product `a` (a.m >= 1).
GemmPlanKey GemmPlanKeyOf(const GemmArgs& a);

// One heuristic candidate as Prepare measured it.
struct GemmCandidateTime {
  bool usable = false;        // the library accepted it at both ends of the bucket
  size_t workspace_bytes = 0;  // what it needs at the bucket's largest m
  float ms = 0.0f;            // mean time of one product at the timed m
};

// The index of the fastest usable candidate that fits `workspace_limit`; among equal times
// the earlier one (the heuristic's own order). -1 when none qualifies.
int PickFastestCandidate(absl::Span<const GemmCandidateTime> candidates, size_t workspace_limit);

// What Prepare chose for one bucket of one shape (reported by Gemm::choices()).
struct GemmPlanChoice {
  GemmPlanKey key;
  int timed_m = 0;                          // the m the candidates were timed at
  std::vector<GemmCandidateTime> candidates;  // in the heuristic's order
  int chosen = -1;                          // index into candidates
};

// One line saying what Prepare chose, e.g. "gemm plan n=7680 k=2560 bf16 bias=0 acc=0
// m=17..32 timed at m=32: [0] 0.0123 ms, [1] unusable, [2] 0.0101 ms; chose [2]" (the
// emulator: "no candidates (OpenBLAS)"). DCF_GEMM_PLAN_LOG=1 makes the backend log them.
std::string DescribeGemmChoice(const GemmPlanChoice& c);

// Plans by key: pinned ones (never evicted) plus an LRU of at most `lru_capacity` others.
// `Plan` is a movable type that releases what it holds in its destructor.
template <typename Plan>
class GemmPlanCache {
 public:
  explicit GemmPlanCache(int lru_capacity) : lru_capacity_(lru_capacity) {}

  // The plan for `key`, or null. A hit on an LRU plan makes it the most recent.
  Plan* Find(const GemmPlanKey& key) {
    auto it = plans_.find(key);
    if (it == plans_.end()) return nullptr;
    if (!it->second.pinned) lru_.splice(lru_.begin(), lru_, it->second.lru_pos);
    return &it->second.plan;
  }

  // Stores `plan` under `key` (replacing any plan there) and returns it. An unpinned insert
  // past the capacity evicts the least recently used unpinned plan.
  Plan* Insert(const GemmPlanKey& key, Plan plan, bool pinned) {
    Erase(key);
    auto [it, inserted] = plans_.emplace(key, Entry{std::move(plan), pinned, {}});
    if (pinned) {
      ++pinned_count_;
    } else {
      lru_.push_front(key);
      it->second.lru_pos = lru_.begin();
      while (static_cast<int>(lru_.size()) > lru_capacity_) {
        const GemmPlanKey victim = lru_.back();
        Erase(victim);
        ++evictions_;
      }
    }
    // The capacity may be 0: then the plan just made is gone and the caller gets null.
    auto found = plans_.find(key);
    return found == plans_.end() ? nullptr : &found->second.plan;
  }

  void Clear() {
    plans_.clear();
    lru_.clear();
    pinned_count_ = 0;
  }

  int size() const { return static_cast<int>(plans_.size()); }
  int pinned() const { return pinned_count_; }
  int unpinned() const { return static_cast<int>(lru_.size()); }
  int lru_capacity() const { return lru_capacity_; }
  int64_t evictions() const { return evictions_; }

 private:
  struct Entry {
    Plan plan;
    bool pinned;
    typename std::list<GemmPlanKey>::iterator lru_pos;
  };

  void Erase(const GemmPlanKey& key) {
    auto it = plans_.find(key);
    if (it == plans_.end()) return;
    if (it->second.pinned) {
      --pinned_count_;
    } else {
      lru_.erase(it->second.lru_pos);
    }
    plans_.erase(it);
  }

  int lru_capacity_;
  std::map<GemmPlanKey, Entry> plans_;
  std::list<GemmPlanKey> lru_;  // unpinned keys, most recent first
  int pinned_count_ = 0;
  int64_t evictions_ = 0;
};

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
