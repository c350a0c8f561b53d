// The GEMM plans' bookkeeping (gemm_plan.h), pure host logic: m buckets, the choice among
// timed candidates, the bounded cache; and Gemm's use of it (Prepare covers the products it
// is given, so that Linear on them builds nothing; products it was not given stay bounded).
#include "engine/cuda/gemm_plan.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <utility>

#include "engine/cuda/gemm.h"
#include "gtest/gtest.h"
#include "tests/unit/cuda/kernel_test_util.h"

namespace dcf::cuda_test {
namespace {

using cuda::ElemType;
using cuda::GemmBucketHi;
using cuda::GemmBucketLo;
using cuda::GemmBucketOf;
using cuda::GemmCandidateTime;
using cuda::GemmPlanKey;

TEST(GemmPlanTest, BucketsPartitionTheRowCounts) {
  // Every m in exactly one bucket, inside its range, and ranges contiguous and ascending.
  int expected_lo = 1;
  for (int b = 0; b <= 12; ++b) {
    EXPECT_EQ(GemmBucketLo(b), expected_lo) << b;
    EXPECT_GE(GemmBucketHi(b), GemmBucketLo(b)) << b;
    expected_lo = GemmBucketHi(b) + 1;
  }
  for (int m = 1; m <= 5000; ++m) {
    const int b = GemmBucketOf(m);
    EXPECT_LE(GemmBucketLo(b), m);
    EXPECT_GE(GemmBucketHi(b), m);
    EXPECT_LE(GemmBucketHi(b), 2 * m) << "a bucket more than doubles m=" << m;
  }
  // Steps of up to 2,048 rows above the GEMV's 16 need 7 plans per shape (17..2048).
  EXPECT_EQ(cuda::GemmBucketsFor(17, 2048), (std::vector<int>{5, 6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(cuda::GemmBucketsFor(1, 1), (std::vector<int>{0}));
  EXPECT_TRUE(cuda::GemmBucketsFor(17, 16).empty());
  std::set<int> distinct;
  for (int m = 17; m <= 2048; ++m) distinct.insert(GemmBucketOf(m));
  EXPECT_EQ(distinct.size(), cuda::GemmBucketsFor(17, 2048).size());
}

TEST(GemmPlanTest, KeyIgnoresTheExactRowCountWithinABucket) {
  alignas(256) static float buf[1024];
  cuda::GemmArgs a;
  a.n = 8;
  a.k = 8;
  a.ldx = 8;
  a.ldy = 8;
  a.x = a.w = a.y = buf;
  a.m = 33;
  const GemmPlanKey k33 = cuda::GemmPlanKeyOf(a);
  a.m = 64;
  EXPECT_EQ(cuda::GemmPlanKeyOf(a), k33);
  a.m = 65;
  EXPECT_FALSE(cuda::GemmPlanKeyOf(a) == k33);
  a.m = 33;
  a.accumulate = true;
  EXPECT_FALSE(cuda::GemmPlanKeyOf(a) == k33);
  a.accumulate = false;
  a.y = buf + 1;  // 4-byte aligned output: another plan
  EXPECT_FALSE(cuda::GemmPlanKeyOf(a) == k33);
  EXPECT_EQ(cuda::GemmAlignmentOf(buf), 256u);
  EXPECT_EQ(cuda::GemmAlignmentOf(buf + 1), 4u);
  EXPECT_EQ(cuda::GemmAlignmentOf(buf + 4), 16u);
}

TEST(GemmPlanTest, PicksTheFastestUsableCandidateWithinTheWorkspace) {
  auto t = [](bool usable, size_t ws, float ms) { return GemmCandidateTime{usable, ws, ms}; };
  EXPECT_EQ(cuda::PickFastestCandidate({}, 100), -1);
  EXPECT_EQ(cuda::PickFastestCandidate({t(true, 0, 2.0f), t(true, 0, 1.0f), t(true, 0, 3.0f)}, 0),
            1);
  // The fastest is unusable, the next needs too much workspace.
  EXPECT_EQ(cuda::PickFastestCandidate(
                {t(true, 0, 2.0f), t(false, 0, 0.5f), t(true, 200, 1.0f), t(true, 100, 1.5f)}, 100),
            3);
  // Ties go to the heuristic's earlier candidate.
  EXPECT_EQ(cuda::PickFastestCandidate({t(true, 0, 2.0f), t(true, 0, 1.0f), t(true, 0, 1.0f)}, 0),
            1);
  // Failed measurements (0, negative, NaN, infinite) never win.
  EXPECT_EQ(cuda::PickFastestCandidate({t(true, 0, 0.0f), t(true, 0, -1.0f), t(true, 0, NAN),
                                        t(true, 0, INFINITY), t(true, 0, 9.0f)},
                                       0),
            4);
  EXPECT_EQ(cuda::PickFastestCandidate({t(false, 0, 1.0f), t(true, 0, NAN)}, 0), -1);

  // Randomised: the pick is the minimum over the qualifying ones, first on ties.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<GemmCandidateTime> c(rng() % 9);
    for (auto& x : c) x = t(rng() % 4 != 0, rng() % 3 * 50, static_cast<float>(rng() % 5));
    const size_t limit = rng() % 3 * 50;
    int want = -1;
    for (int i = 0; i < static_cast<int>(c.size()); ++i) {
      if (!c[i].usable || c[i].workspace_bytes > limit || c[i].ms <= 0.0f) continue;
      if (want < 0 || c[i].ms < c[want].ms) want = i;
    }
    EXPECT_EQ(cuda::PickFastestCandidate(c, limit), want) << trial;
  }
}

TEST(GemmPlanTest, DescribesTheChoice) {
  cuda::GemmPlanChoice c;
  c.key.bucket = 6;
  c.key.n = 7680;
  c.key.k = 2560;
  c.key.dtype = ElemType::kBF16;
  c.key.bias = true;
  c.timed_m = 64;
  EXPECT_EQ(cuda::DescribeGemmChoice(c),
            "gemm plan n=7680 k=2560 bf16 bias=1 acc=0 m=33..64 timed at m=64: no candidates "
            "(OpenBLAS)");
  c.candidates = {GemmCandidateTime{true, 0, 0.0123f}, GemmCandidateTime{false, 0, 0.0f},
                  GemmCandidateTime{true, 0, 0.0101f}};
  c.chosen = cuda::PickFastestCandidate(c.candidates, 0);
  EXPECT_EQ(cuda::DescribeGemmChoice(c),
            "gemm plan n=7680 k=2560 bf16 bias=1 acc=0 m=33..64 timed at m=64: [0] 0.0123 ms, "
            "[1] unusable, [2] 0.0101 ms; chose [2]");
}

// A plan that counts the live ones: the cache must release what it drops.
struct CountedPlan {
  static int live;
  int id = -1;
  bool owns = false;
  CountedPlan() = default;
  explicit CountedPlan(int i) : id(i), owns(true) { ++live; }
  CountedPlan(CountedPlan&& o) noexcept : id(o.id), owns(std::exchange(o.owns, false)) {}
  CountedPlan& operator=(CountedPlan&& o) noexcept {
    if (owns) --live;
    id = o.id;
    owns = std::exchange(o.owns, false);
    return *this;
  }
  ~CountedPlan() {
    if (owns) --live;
  }
};
int CountedPlan::live = 0;

GemmPlanKey KeyN(int n, int bucket = 5) {
  GemmPlanKey k;
  k.n = n;
  k.k = 64;
  k.bucket = bucket;
  return k;
}

TEST(GemmPlanTest, CacheStaysBoundedAndEvictsTheLeastRecentlyUsed) {
  CountedPlan::live = 0;
  {
    cuda::GemmPlanCache<CountedPlan> cache(4);
    // Pinned plans (Prepare's) are never evicted and do not count against the LRU.
    for (int i = 0; i < 10; ++i) cache.Insert(KeyN(1000 + i), CountedPlan(1000 + i), true);
    for (int i = 0; i < 100; ++i) {
      cache.Insert(KeyN(i), CountedPlan(i), false);
      EXPECT_LE(cache.unpinned(), 4);
      EXPECT_EQ(cache.size(), 10 + cache.unpinned());
      EXPECT_EQ(CountedPlan::live, cache.size());
      if (i % 3 == 0) {
        ASSERT_NE(cache.Find(KeyN(1000)), nullptr);  // pinned stays
      }
    }
    EXPECT_EQ(cache.unpinned(), 4);
    EXPECT_EQ(cache.pinned(), 10);
    EXPECT_EQ(cache.evictions(), 96);
    for (int i = 0; i < 10; ++i) EXPECT_NE(cache.Find(KeyN(1000 + i)), nullptr) << i;
    // 96..99 are held; touching 96 makes 97 the least recent.
    ASSERT_NE(cache.Find(KeyN(96)), nullptr);
    cache.Insert(KeyN(200), CountedPlan(200), false);
    EXPECT_EQ(cache.Find(KeyN(97)), nullptr);
    EXPECT_NE(cache.Find(KeyN(96)), nullptr);
    EXPECT_NE(cache.Find(KeyN(98)), nullptr);
    EXPECT_NE(cache.Find(KeyN(200)), nullptr);
    EXPECT_EQ(cache.Find(KeyN(200))->id, 200);
    // Reinserting a key replaces its plan, no duplicate.
    cache.Insert(KeyN(200), CountedPlan(201), false);
    EXPECT_EQ(cache.Find(KeyN(200))->id, 201);
    EXPECT_EQ(cache.unpinned(), 4);
    EXPECT_EQ(CountedPlan::live, cache.size());
    cache.Clear();
    EXPECT_EQ(cache.size(), 0);
    EXPECT_EQ(CountedPlan::live, 0);
    cache.Insert(KeyN(1), CountedPlan(1), false);
  }
  EXPECT_EQ(CountedPlan::live, 0);  // the destructor releases the rest
}

TEST(GemmPlanTest, CacheMatchesAReferenceLruUnderRandomUse) {
  constexpr int kCap = 5;
  cuda::GemmPlanCache<CountedPlan> cache(kCap);
  std::vector<int> ref;  // unpinned keys, most recent first
  std::set<int> pinned;
  std::mt19937 rng(11);
  for (int op = 0; op < 5000; ++op) {
    const int n = static_cast<int>(rng() % 12);
    const int what = static_cast<int>(rng() % 10);
    auto in_ref = std::find(ref.begin(), ref.end(), n);
    if (what < 4) {  // find
      CountedPlan* p = cache.Find(KeyN(n));
      const bool want = pinned.count(n) || in_ref != ref.end();
      ASSERT_EQ(p != nullptr, want) << op;
      if (in_ref != ref.end()) std::rotate(ref.begin(), in_ref, in_ref + 1);
    } else if (what < 9) {  // insert on use
      cache.Insert(KeyN(n), CountedPlan(n), false);
      pinned.erase(n);
      if (in_ref != ref.end()) ref.erase(in_ref);
      ref.insert(ref.begin(), n);
      if (static_cast<int>(ref.size()) > kCap) ref.pop_back();
    } else {  // pin
      cache.Insert(KeyN(n), CountedPlan(n), true);
      pinned.insert(n);
      if (in_ref != ref.end()) ref.erase(in_ref);
    }
    ASSERT_EQ(cache.unpinned(), static_cast<int>(ref.size())) << op;
    ASSERT_EQ(cache.pinned(), static_cast<int>(pinned.size())) << op;
  }
}

// Gemm::Prepare covers every bucket of the products it is given: afterwards Linear at any m
// of min_m..max_m builds no plan and the results are the plain product's. Products it was
// not given build plans on use, at most Gemm::kLazyPlanCapacity of them held.
TEST(GemmPlanTest, PreparedProductsBuildNothingAndOthersStayBounded) {
  const ElemType type = ElemType::kBF16;
  constexpr int kMaxM = 100, kN = 48, kK = 64;
  auto gemm = cuda::Gemm::Create(size_t{4} << 20);
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  const std::vector<float> x = RandomVector(kMaxM * kK, 51);
  const std::vector<float> w = RandomVector(kN * kK, 52);
  const std::vector<float> bias = RandomVector(kN, 53);
  TypedBuffer dx(x, type), dw(w, type);
  DeviceBuffer<float> db(bias), dy(std::vector<float>(kMaxM * kN, 0.0f));
  cuda::GemmArgs a;
  a.m = kMaxM;
  a.n = kN;
  a.k = kK;
  a.x = dx.get();
  a.ldx = kK;
  a.w = dw.get();
  a.dtype = type;
  a.bias = db.get();
  a.y = dy.get();
  a.ldy = kN;
  ASSERT_TRUE((*gemm)->Prepare({a}, 17, nullptr).ok());
  // 17..100: buckets 32, 64 and 128.
  EXPECT_EQ((*gemm)->stats().pinned_plans, 3);
  ASSERT_EQ((*gemm)->choices().size(), 3u);
  EXPECT_EQ((*gemm)->choices()[2].timed_m, kMaxM);  // the buffers hold no more rows
  for (int m : {17, 32, 33, 63, 64, 65, 99, 100}) {
    cuda::GemmArgs at = a;
    at.m = m;
    ASSERT_TRUE((*gemm)->Linear(at, nullptr).ok()) << m;
    ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
    const std::vector<float> want =
        LinearWant(RoundTo(x, type), RoundTo(w, type), bias.data(),
                   std::vector<float>(kMaxM * kN, 0.0f), m, kN, kK, kK, kN, false);
    const std::vector<float> got = dy.ToHost();
    EXPECT_LT(MaxAbs(std::vector<float>(got.begin(), got.begin() + m * kN),
                     std::vector<float>(want.begin(), want.begin() + m * kN)),
              1e-4)
        << "m=" << m;
  }
  EXPECT_EQ((*gemm)->stats().plans_built_on_use, 0);

  // Unprepared shapes: n varies, one plan each on first use; the cache stays bounded.
  constexpr int kShapes = cuda::Gemm::kLazyPlanCapacity + 10;
  static_assert(kShapes <= kN, "the shapes' n must fit the buffers");
  for (int i = 0; i < kShapes; ++i) {
    cuda::GemmArgs other = a;
    other.m = 20;
    other.n = 1 + i;  // <= kN: fits the buffers
    ASSERT_TRUE((*gemm)->Linear(other, nullptr).ok()) << i;
    other.m = 30;  // the same bucket: no new plan
    ASSERT_TRUE((*gemm)->Linear(other, nullptr).ok()) << i;
  }
  ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
  const cuda::Gemm::Stats s = (*gemm)->stats();
  EXPECT_EQ(s.plans_built_on_use, kShapes);
  EXPECT_EQ(s.cached_plans, cuda::Gemm::kLazyPlanCapacity);
  EXPECT_EQ(s.evictions, kShapes - cuda::Gemm::kLazyPlanCapacity);
  EXPECT_EQ(s.pinned_plans, 3);
  // A new Prepare drops everything before.
  ASSERT_TRUE((*gemm)->Prepare({a}, 1, nullptr).ok());
  EXPECT_EQ((*gemm)->stats().pinned_plans, 8);  // buckets 1, 2, 4, ..., 128
  EXPECT_EQ((*gemm)->stats().cached_plans, 0);
}

}  // namespace
}  // namespace dcf::cuda_test
