// The incremental n-gram proposer against a brute-force rescan of the whole context at
// every step (the rule it implements), over random token streams with small alphabets (many
// matches, of every length) and hand-checked cases.
#include "engine/serving/ngram_proposer.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace dcf {
namespace {

// The rule, by rescanning: the longest n in [min_n, max_n] whose suffix tokens[len - n, len)
// occurred earlier ending at some e < len; the latest such e; then tokens[e, e + k).
std::vector<int32_t> Reference(const std::vector<int32_t>& t, int min_n, int max_n, int k) {
  const int len = static_cast<int>(t.size());
  if (k <= 0) return {};
  for (int n = std::min(max_n, len - 1); n >= min_n; --n) {
    for (int e = len - 1; e >= n; --e) {
      if (std::equal(t.begin() + (e - n), t.begin() + e, t.end() - n)) {
        const int count = std::min(k, len - e);
        return std::vector<int32_t>(t.begin() + e, t.begin() + e + count);
      }
    }
  }
  return {};
}

TEST(NgramProposerTest, MatchesARescanOnRandomStreams) {
  std::mt19937 rng(20261202);
  int proposals = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int min_n = 1 + static_cast<int>(rng() % 3);
    const int max_n = min_n + static_cast<int>(rng() % 3);
    const int alphabet = 2 + static_cast<int>(rng() % 6);
    NgramProposer proposer({min_n, max_n});
    std::vector<int32_t> tokens;
    const int prompt = static_cast<int>(rng() % 20);
    for (int i = 0; i < prompt; ++i) tokens.push_back(static_cast<int32_t>(rng() % alphabet));
    std::vector<int32_t> draft;
    for (int step = 0; step < 80; ++step) {
      const int k = static_cast<int>(rng() % 6);
      proposer.Propose(tokens, k, &draft);
      ASSERT_EQ(draft, Reference(tokens, min_n, max_n, k))
          << "trial " << trial << " step " << step << " n " << min_n << ".." << max_n;
      proposals += !draft.empty();
      // Appends one to four tokens, as an accepted run would.
      const int add = 1 + static_cast<int>(rng() % 4);
      for (int i = 0; i < add; ++i) tokens.push_back(static_cast<int32_t>(rng() % alphabet));
    }
  }
  EXPECT_GT(proposals, 1000);
}

TEST(NgramProposerTest, ProposesWhatFollowedTheLatestLongestMatch) {
  NgramProposer p({1, 3});
  std::vector<int32_t> draft;
  // "1 2 3 9 ... 1 2 3 8 ... 2 3": the 3-gram "x 2 3" is absent, the 2-gram "2 3" ends at two
  // places; the latest one is followed by 8.
  const std::vector<int32_t> t = {1, 2, 3, 9, 5, 1, 2, 3, 8, 6, 7, 2, 3};
  p.Propose(t, 3, &draft);
  EXPECT_EQ(draft, (std::vector<int32_t>{8, 6, 7}));
  // No earlier occurrence of the last token: nothing.
  NgramProposer q({1, 3});
  q.Propose({4, 5, 6}, 3, &draft);
  EXPECT_TRUE(draft.empty());
  // A match near the end proposes fewer tokens.
  NgramProposer r({1, 2});
  r.Propose({7, 7}, 5, &draft);
  EXPECT_EQ(draft, (std::vector<int32_t>{7}));
}

}  // namespace
}  // namespace dcf
