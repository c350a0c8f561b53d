#include "engine/cuda/gemm_plan.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "engine/cuda/gemm.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {

int GemmBucketOf(int m) {
  int b = 0;
  while (GemmBucketHi(b) < m) ++b;
  return b;
}

int GemmBucketLo(int bucket) { return bucket == 0 ? 1 : (1 << (bucket - 1)) + 1; }

int GemmBucketHi(int bucket) { return 1 << bucket; }

std::vector<int> GemmBucketsFor(int min_m, int max_m) {
  std::vector<int> buckets;
  if (min_m < 1) min_m = 1;
  if (min_m > max_m) return buckets;
  for (int b = GemmBucketOf(min_m); b <= GemmBucketOf(max_m); ++b) buckets.push_back(b);
  return buckets;
}

uint32_t GemmAlignmentOf(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align >>= 1;
  return align;
}

GemmPlanKey GemmPlanKeyOf(const GemmArgs& a) {
  GemmPlanKey key;
  key.bucket = GemmBucketOf(a.m);
  key.n = a.n;
  key.k = a.k;
  key.ldx = a.ldx;
  key.ldy = a.ldy;
  key.dtype = a.dtype;
  key.fp8 = a.wtype == WeightType::kFp8 && a.fp8_activations;
  key.bias = a.bias != nullptr;
  key.accumulate = a.accumulate;
  key.align_x = GemmAlignmentOf(a.x);
  key.align_w = GemmAlignmentOf(a.w);
  key.align_y = GemmAlignmentOf(a.y);
  return key;
}

int PickFastestCandidate(absl::Span<const GemmCandidateTime> candidates,
                         size_t workspace_limit) {
  int best = -1;
  for (int i = 0; i < static_cast<int>(candidates.size()); ++i) {
    const GemmCandidateTime& c = candidates[i];
    // A time that is not a finite positive number (a failed measurement) never wins.
    if (!c.usable || c.workspace_bytes > workspace_limit || !(c.ms > 0.0f) ||
        c.ms > 3.0e38f) {
      continue;
    }
    if (best < 0 || c.ms < candidates[best].ms) best = i;
  }
  return best;
}

std::string DescribeGemmChoice(const GemmPlanChoice& c) {
  const GemmPlanKey& k = c.key;
  const char* type = k.fp8                          ? "fp8"
                     : k.dtype == ElemType::kF32  ? "f32"
                     : k.dtype == ElemType::kBF16 ? "bf16"
                                                  : "f16";
  std::string s = absl::StrCat("gemm plan n=", k.n, " k=", k.k, " ", type, " bias=", k.bias ? 1 : 0,
                               " acc=", k.accumulate ? 1 : 0, " m=", GemmBucketLo(k.bucket), "..",
                               GemmBucketHi(k.bucket), " timed at m=", c.timed_m, ": ");
  if (c.candidates.empty()) return s + "no candidates (OpenBLAS)";
  for (size_t i = 0; i < c.candidates.size(); ++i) {
    const GemmCandidateTime& t = c.candidates[i];
    absl::StrAppend(&s, i == 0 ? "" : ", ", "[", i, "] ");
    if (t.usable) {
      char ms[32];
      std::snprintf(ms, sizeof(ms), "%.4f ms", t.ms);
      absl::StrAppend(&s, ms);
    } else {
      absl::StrAppend(&s, "unusable");
    }
  }
  absl::StrAppend(&s, "; chose [", c.chosen, "]");
  return s;
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
