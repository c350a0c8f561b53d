// Randomized property test of prefix caching over the pure objects (Scheduler +
// KvCacheManager, no model): thousands of steps of random arrivals sharing prefixes (two
// salts), cancellations, preemptions and evictions in a small pool. A fake step stands in
// for the backend: it "writes" every new row into the block its table names, as a backend
// does, and checks every cached row it reads. The cache is shadowed row by row with what
// each row is the K/V of (the writer's salt and tokens up to that position).
//
// After every step:
//  * the pools are consistent: no block is both free and referenced (BlockAllocator::Validate);
//  * every block's reference count equals the number of block tables that hold it;
//  * every cached hash maps to a block that holds exactly the rows of the tokens it names;
//  * every row a step read from the cache is the one the reading sequence would compute,
//    and no step wrote into a block another sequence holds or a cached block;
//  * an admitted sequence's first chunk starts at its hit, whose tokens cost no budget.
// When everything has ended every block is free.
#include <algorithm>
#include <array>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "engine/kv/block_hash.h"
#include "engine/kv/kv_cache_planner.h"
#include "engine/serving/scheduler.h"
#include "gtest/gtest.h"
#include "tests/testing/kv_shape.h"

namespace dcf {
namespace {

// What a cache row holds: the K/V of position prefix.size() - 1 of a sequence with this
// salt and these tokens (empty: never written).
struct RowId {
  std::string salt;
  std::vector<int32_t> prefix;
  bool operator==(const RowId& o) const { return salt == o.salt && prefix == o.prefix; }
};

struct Config {
  int block_size;
  int window;
  int max_num_seqs;
  int budget;
  int chunk;
};

class World {
 public:
  explicit World(const Config& c, uint32_t seed)
      : rng_(seed),
        shape_(MakeShape(c)),
        kv_(shape_, /*prefix_caching=*/true),
        sched_(SchedulerConfig{c.max_num_seqs, c.budget, c.chunk, 0.0}, &kv_) {
    for (int g = 0; g < kNumLayerGroups; ++g) {
      shadow_[g].assign(shape_.num_blocks[g], std::vector<RowId>(shape_.block_size));
    }
    for (int f = 0; f < 4; ++f) {
      std::vector<int32_t> fam;
      for (int i = 0; i < kMaxShared; ++i) fam.push_back(static_cast<int32_t>(rng_() % 40));
      families_.push_back(fam);
    }
  }

  // One step of the random world: arrivals (when `arrivals`), maybe a cancellation, the
  // schedule, the fake model step, the commit, the sampled tokens; then the invariants.
  void Step(bool arrivals) {
    // Arrivals keep a short queue (a bounded backlog, so that many sequences are admitted).
    if (arrivals && sched_.num_waiting() < 4 && rng_() % 2 == 0) Arrive();
    if (rng_() % 23 == 0) CancelOne();
    SchedulerOutput out = sched_.Schedule();
    int tokens = 0;
    for (size_t i = 0; i < out.admitted.size(); ++i) {
      const int hit = out.cached_tokens[i];
      hits_ += hit > 0;
      if (hit > 0 && out.admitted[i]->num_preemptions > 0) ++readmission_hits_;
      auto c = std::find_if(out.chunks.begin(), out.chunks.end(),
                            [&](const ScheduledChunk& c) { return c.seq == out.admitted[i]; });
      ASSERT_NE(c, out.chunks.end());
      ASSERT_EQ(c->start, hit) << "the first chunk starts at the hit";
    }
    for (const ScheduledChunk& c : out.chunks) {
      tokens += c.num_tokens;
      ASSERT_EQ(c.start, c.seq->kv.num_tokens);
      FakeCompute(c);
      if (::testing::Test::HasFatalFailure()) return;
    }
    ASSERT_EQ(tokens, out.num_tokens);
    ASSERT_LE(tokens, sched_.config().max_num_batched_tokens);
    preemptions_ += static_cast<int>(out.preempted.size());
    sched_.Commit(out);
    for (const ScheduledChunk& c : out.chunks) {
      if (!c.samples) continue;
      Sequence* s = c.seq;
      s->tokens.push_back(static_cast<int32_t>(rng_() % 40));
      if (static_cast<int>(s->tokens.size()) == s->max_len) {
        sched_.Remove(s);
        SetState(*s, RequestState::kFinished);
      }
    }
    CheckInvariants();
  }

  bool HasWork() const { return sched_.HasWork(); }
  const KvCacheManager& kv() const { return kv_; }
  int hits() const { return hits_; }
  int readmission_hits() const { return readmission_hits_; }
  int preemptions() const { return preemptions_; }
  int cancellations() const { return cancellations_; }
  int sequences() const { return static_cast<int>(seqs_.size()); }

 private:
  static constexpr int kMaxShared = 40;

  static KvCacheShape MakeShape(const Config& c) {
    const int B = c.block_size;
    const int max_len = kMaxShared + 10 + 16;
    KvCacheShape s = testing::Shape(0, 0, c.window, B);
    const std::array<int, kNumLayerGroups> alone = BlocksToRunAlone(s, max_len);
    // Global: room for about two long sequences, so preemption and eviction are frequent.
    // Window: what the planner gives it (kv_cache_planner.h).
    KvPlanInput in;
    in.block_size = B;
    in.window = c.window;
    in.context = max_len;
    in.max_num_seqs = c.max_num_seqs;
    in.max_num_batched_tokens = c.budget;
    s.num_blocks = {alone[0] * 2 + 1, std::max(alone[1], WindowGroupDemand(in))};
    return s;
  }

  RowId IdOf(const Sequence& s, int pos) const {
    return RowId{salt_.at(&s), std::vector<int32_t>(s.tokens.begin(), s.tokens.begin() + pos + 1)};
  }

  void Arrive() {
    auto s = std::make_unique<Sequence>();
    s->seq_id = static_cast<int64_t>(seqs_.size());
    const auto& fam = families_[rng_() % families_.size()];
    const int shared = static_cast<int>(rng_() % (kMaxShared + 1));
    s->tokens.assign(fam.begin(), fam.begin() + shared);
    const int extra = 1 + static_cast<int>(rng_() % 10);
    for (int i = 0; i < extra; ++i) s->tokens.push_back(static_cast<int32_t>(rng_() % 40));
    s->prompt_len = static_cast<int>(s->tokens.size());
    s->max_len = s->prompt_len + 1 + static_cast<int>(rng_() % 16);
    const std::string salt = rng_() % 4 == 0 ? "tenant-b" : "";
    s->kv.hash_root = SaltRoot(salt);
    ASSERT_TRUE(FitsPoolAlone(shape_, s->max_len));
    salt_[s.get()] = salt;
    sched_.Add(s.get());
    seqs_.push_back(std::move(s));
  }

  void CancelOne() {
    std::vector<Sequence*> live;
    for (auto& s : seqs_) {
      if (!IsFinal(s->state)) live.push_back(s.get());
    }
    if (live.empty()) return;
    Sequence* s = live[rng_() % live.size()];
    sched_.Remove(s);
    SetState(*s, RequestState::kCancelled);
    ++cancellations_;
  }

  // The backend's part: reads the cached keys the chunk's queries see, writes its new rows.
  void FakeCompute(const ScheduledChunk& c) {
    const Sequence& s = *c.seq;
    const int B = shape_.block_size;
    for (int g = 0; g < kNumLayerGroups; ++g) {
      const LayerGroup group = static_cast<LayerGroup>(g);
      const auto& table = s.kv.blocks[g];
      for (int p = kv_.FirstKeptPosition(group, c.start); p < c.start; ++p) {
        ASSERT_LT(p / B, static_cast<int>(table.size()));
        const int32_t b = table[p / B];
        ASSERT_NE(b, kNoBlock) << "seq " << s.seq_id << " reads position " << p << " group " << g;
        ASSERT_TRUE(shadow_[g][b][p % B] == IdOf(s, p))
            << "seq " << s.seq_id << " reads a wrong row at " << p << " in group " << g;
      }
      for (int p = c.start; p < c.start + c.num_tokens; ++p) {
        ASSERT_LT(p / B, static_cast<int>(table.size()));
        const int32_t b = table[p / B];
        if (b == kNoBlock) continue;
        ASSERT_EQ(kv_.allocator(group).refcount(b), 1) << "write into a shared block";
        ASSERT_FALSE(kv_.allocator(group).is_cached(b)) << "write into a cached block";
        shadow_[g][b][p % B] = IdOf(s, p);
      }
    }
  }

  void CheckInvariants() {
    const int B = shape_.block_size;
    // The hashes of every full block of every sequence ever seen -> the tokens they name.
    for (auto& s : seqs_) {
      std::vector<BlockHash>& chain = chains_[s.get()];
      for (int i = static_cast<int>(chain.size()); (i + 1) * B <= static_cast<int>(s->tokens.size());
           ++i) {
        const BlockHash parent = i == 0 ? SaltRoot(salt_[s.get()]) : chain[i - 1];
        chain.push_back(HashBlock(parent, absl::MakeConstSpan(s->tokens).subspan(i * B, B)));
        named_.emplace(chain.back(),
                       RowId{salt_[s.get()], std::vector<int32_t>(s->tokens.begin(),
                                                                  s->tokens.begin() + (i + 1) * B)});
      }
    }
    for (int g = 0; g < kNumLayerGroups; ++g) {
      const LayerGroup group = static_cast<LayerGroup>(g);
      const BlockAllocator& pool = kv_.allocator(group);
      ASSERT_TRUE(pool.Validate().ok()) << pool.Validate();
      std::vector<int> refs(pool.num_blocks(), 0);
      for (const Sequence* s : sched_.running()) {
        for (int32_t b : s->kv.blocks[g]) {
          if (b != kNoBlock) ++refs[b];
        }
      }
      for (const Sequence* s : sched_.waiting()) {
        ASSERT_EQ(s->kv.num_tokens, 0);
        ASSERT_EQ(s->kv.HeldBlocks(group), 0) << "a waiting sequence holds blocks";
      }
      for (int b = 0; b < pool.num_blocks(); ++b) {
        ASSERT_EQ(refs[b], pool.refcount(b)) << "group " << g << " block " << b;
        if (!pool.is_cached(b)) continue;
        ASSERT_EQ(pool.Lookup(pool.hash(b)), b);
        auto it = named_.find(pool.hash(b));
        ASSERT_NE(it, named_.end()) << "a cached hash no sequence's tokens give";
        const RowId& id = it->second;
        const int first = static_cast<int>(id.prefix.size()) - B;
        for (int r = 0; r < B; ++r) {
          const RowId want{id.salt, std::vector<int32_t>(id.prefix.begin(),
                                                         id.prefix.begin() + first + r + 1)};
          ASSERT_TRUE(shadow_[g][b][r] == want)
              << "group " << g << " block " << b << " row " << r << " is not what its hash names";
        }
      }
    }
  }

  std::mt19937 rng_;
  const KvCacheShape shape_;
  KvCacheManager kv_;
  Scheduler sched_;
  std::vector<std::vector<int32_t>> families_;
  std::vector<std::unique_ptr<Sequence>> seqs_;
  std::map<const Sequence*, std::string> salt_;
  std::map<const Sequence*, std::vector<BlockHash>> chains_;
  absl::flat_hash_map<BlockHash, RowId> named_;
  std::array<std::vector<std::vector<RowId>>, kNumLayerGroups> shadow_;  // [g][block][slot]
  int hits_ = 0;
  int readmission_hits_ = 0;
  int preemptions_ = 0;
  int cancellations_ = 0;
};

class PrefixCachePropertyTest : public ::testing::TestWithParam<Config> {};

TEST_P(PrefixCachePropertyTest, InvariantsHoldOverRandomTraffic) {
  constexpr int kSteps = 5000;
  World w(GetParam(), 1234 + GetParam().block_size * 7 + GetParam().window);
  for (int i = 0; i < kSteps; ++i) {
    w.Step(/*arrivals=*/true);
    ASSERT_FALSE(::testing::Test::HasFatalFailure()) << "step " << i;
  }
  for (int i = 0; i < 100000 && w.HasWork(); ++i) {
    w.Step(/*arrivals=*/false);
    ASSERT_FALSE(::testing::Test::HasFatalFailure()) << "drain step " << i;
  }
  ASSERT_FALSE(w.HasWork());
  for (LayerGroup g : {LayerGroup::kGlobal, LayerGroup::kWindow}) {
    EXPECT_EQ(w.kv().num_used(g), 0);
    EXPECT_EQ(w.kv().num_free(g), w.kv().allocator(g).num_blocks());
  }
  // The paths under test were taken, many times.
  EXPECT_GT(w.sequences(), 500);
  EXPECT_GT(w.hits(), 100);
  EXPECT_GT(w.preemptions(), 10);
  EXPECT_GT(w.readmission_hits(), 0);
  EXPECT_GT(w.cancellations(), 50);
  EXPECT_GT(w.kv().num_evictions(LayerGroup::kGlobal), 100);
  RecordProperty("hits", w.hits());
  RecordProperty("preemptions", w.preemptions());
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PrefixCachePropertyTest,
    ::testing::Values(Config{4, 6, 4, 16, 0}, Config{1, 5, 4, 12, 0}, Config{5, 16, 4, 24, 7},
                      Config{16, 16, 6, 32, 0}, Config{3, 0, 4, 12, 5}),
    [](const ::testing::TestParamInfo<Config>& info) {
      return absl::StrCat("B", info.param.block_size, "_W", info.param.window, "_chunk",
                          info.param.chunk);
    });

}  // namespace
}  // namespace dcf
