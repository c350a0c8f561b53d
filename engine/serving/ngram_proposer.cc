#include "engine/serving/ngram_proposer.h"

#include <algorithm>

#include "engine/common/logging.h"

namespace dcf {

NgramProposer::NgramProposer(const NgramOptions& options) : options_(options) {
  DCF_CHECK(options_.min_n >= 1 && options_.max_n >= options_.min_n)
      << "n-gram lengths " << options_.min_n << ".." << options_.max_n;
  last_.resize(options_.max_n - options_.min_n + 1);
}

uint64_t NgramProposer::Hash(absl::Span<const int32_t> tokens, int end, int n) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(n);
  for (int i = end - n; i < end; ++i) {
    h ^= static_cast<uint32_t>(tokens[i]);
    h *= 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  return h;
}

void NgramProposer::Index(absl::Span<const int32_t> tokens, int end) {
  for (int n = options_.min_n; n <= options_.max_n && n <= end; ++n) {
    last_[n - options_.min_n][Hash(tokens, end, n)] = end;
  }
}

void NgramProposer::Propose(absl::Span<const int32_t> tokens, int max_tokens,
                            std::vector<int32_t>* draft) {
  draft->clear();
  const int len = static_cast<int>(tokens.size());
  // Index every n-gram whose continuation is a known token (ending before len): the suffix
  // itself (ending at len) must not match its own occurrence.
  for (; indexed_ < len; ++indexed_) {
    if (indexed_ > 0) Index(tokens, indexed_);
  }
  if (max_tokens <= 0) return;
  for (int n = std::min(options_.max_n, len - 1); n >= options_.min_n; --n) {
    const auto& map = last_[n - options_.min_n];
    const auto it = map.find(Hash(tokens, len, n));
    if (it == map.end()) continue;
    const int next = it->second;  // the earlier occurrence is tokens[next - n, next)
    // A hash collision proposes something wrong, which costs only the verification; compare
    // anyway so that proposals are what the rule says.
    if (!std::equal(tokens.begin() + (next - n), tokens.begin() + next, tokens.end() - n)) {
      continue;
    }
    const int count = std::min(max_tokens, len - next);
    draft->assign(tokens.begin() + next, tokens.begin() + next + count);
    return;
  }
}

}  // namespace dcf
