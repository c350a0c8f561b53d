#include "engine/tokenizer/bpe.h"

#include <queue>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/byte_level.h"

namespace dcf {

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(
    const absl::flat_hash_map<std::string, int32_t>& vocab,
    const std::vector<std::pair<std::string, std::string>>& merges, const Options& options) {
  std::unique_ptr<BpeModel> model(new BpeModel());
  model->options_ = options;
  model->byte_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    std::string token;
    AppendByteLevel(std::string_view(reinterpret_cast<const char*>(&b), 1), &token);
    if (auto it = vocab.find(token); it != vocab.end()) model->byte_ids_[b] = it->second;
  }
  model->merges_.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const auto l = vocab.find(left);
    const auto r = vocab.find(right);
    const auto m = vocab.find(absl::StrCat(left, right));
    if (l == vocab.end() || r == vocab.end() || m == vocab.end()) {
      return absl::InvalidArgumentError(absl::StrCat("model.merges[", rank, "] (\"", left, " ",
                                                     right,
                                                     "\") refers to a token not in the vocab"));
    }
    // Later duplicates overwrite earlier ones, as HF's HashMap collection does.
    model->merges_.insert_or_assign(PairKey(l->second, r->second),
                                    Merge{static_cast<int32_t>(rank), m->second});
  }
  if (options.ignore_merges) {
    for (const auto& [token, id] : vocab) {
      if (std::optional<std::string> bytes = ByteLevelToBytes(token)) {
        model->bytes_to_id_.emplace(*std::move(bytes), id);
      }
    }
  }
  return model;
}

void BpeModel::EncodeWord(std::string_view word, std::vector<int32_t>* ids) const {
  if (word.empty()) return;
  if (word.size() > kMaxCachedWordBytes) {
    EncodeUncached(word, ids);
    return;
  }
  // Debian's Abseil has its own absl::string_view, which is what heterogeneous lookup takes.
  const absl::string_view key(word.data(), word.size());
  CacheShard& shard = cache_[absl::HashOf(key) % kNumShards];
  {
    absl::ReaderMutexLock lock(&shard.mu);
    if (auto it = shard.words.find(key); it != shard.words.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = ids->size();
  EncodeUncached(word, ids);
  absl::MutexLock lock(&shard.mu);
  if (shard.words.size() < kMaxCacheEntries / kNumShards) {
    shard.words.try_emplace(std::string(word), ids->begin() + first, ids->end());
  }
}

void BpeModel::EncodeUncached(std::string_view word, std::vector<int32_t>* ids) const {
  if (options_.ignore_merges) {
    if (auto it = bytes_to_id_.find(absl::string_view(word.data(), word.size()));
        it != bytes_to_id_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  // Symbols form a doubly linked list in a vector; list order equals index order, so "leftmost"
  // is a plain integer comparison of the left symbol's index.
  const int n = static_cast<int>(word.size());
  struct Symbol {
    int32_t id;
    int prev;
    int next;  // -1 at the ends
  };
  std::vector<Symbol> symbols;
  symbols.reserve(n);
  for (int i = 0; i < n; ++i) {
    int32_t id = byte_ids_[static_cast<uint8_t>(word[i])];
    if (id < 0) {
      if (!options_.unk_id.has_value()) continue;
      id = *options_.unk_id;
    }
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({id, index - 1, -1});
    if (index > 0) symbols[index - 1].next = index;
  }
  if (symbols.size() > 1) {
    struct Candidate {
      int32_t rank;
      int left;
      int32_t left_id;
      int32_t right_id;
      int32_t merged_id;
      bool operator>(const Candidate& o) const {
        return rank != o.rank ? rank > o.rank : left > o.left;
      }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
    auto push_pair = [&](int left) {
      const int right = symbols[left].next;
      if (right < 0) return;
      if (auto it = merges_.find(PairKey(symbols[left].id, symbols[right].id));
          it != merges_.end()) {
        queue.push(
            {it->second.rank, left, symbols[left].id, symbols[right].id, it->second.merged_id});
      }
    };
    for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i) push_pair(i);
    while (!queue.empty()) {
      const Candidate c = queue.top();
      queue.pop();
      Symbol& left = symbols[c.left];
      // Stale entries: the left symbol was merged away (id -1) or changed, or its neighbour did.
      if (left.id != c.left_id || left.next < 0 || symbols[left.next].id != c.right_id) continue;
      const int right = left.next;
      left.id = c.merged_id;
      left.next = symbols[right].next;
      if (left.next >= 0) symbols[left.next].prev = c.left;
      symbols[right].id = -1;
      if (left.prev >= 0) push_pair(left.prev);
      push_pair(c.left);
    }
  }
  for (int i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
}

}  // namespace dcf
