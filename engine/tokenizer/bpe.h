// Byte-level BPE model: turns one pre-tokenized word (raw bytes) into vocabulary ids by applying
// merges in rank order, exactly like Hugging Face's BPE model (dropout off): repeatedly merge the
// adjacent pair with the lowest rank, the leftmost one on ties.
//
// Thread-safety: EncodeWord is const and safe to call from any number of threads. Results for
// words up to kMaxCachedWordBytes are memoised in a sharded, absl::Mutex-guarded cache holding at
// most kMaxCacheEntries words in total; once a shard is full, new words are computed but not
// stored (as HF does), so memory stays bounded.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace dcf {

class BpeModel {
 public:
  static constexpr size_t kMaxCachedWordBytes = 256;
  static constexpr size_t kMaxCacheEntries = 1 << 18;

  struct Options {
    std::optional<int32_t> unk_id;  // used for bytes that have no vocabulary entry
    bool ignore_merges = false;     // a word that is itself in the vocabulary maps to that id
  };

  // `vocab` maps byte-level token strings (e.g. "Ġthe") to ids; `merges` lists pairs of tokens in
  // rank order. InvalidArgument (naming "model.merges") when a merge refers to a token, or
  // produces a concatenation, that is not in the vocabulary.
  static absl::StatusOr<std::unique_ptr<BpeModel>> Create(
      const absl::flat_hash_map<std::string, int32_t>& vocab,
      const std::vector<std::pair<std::string, std::string>>& merges, const Options& options);

  // Appends the ids of the raw-byte `word` to `ids`. A byte with no vocabulary entry becomes
  // options.unk_id, or is dropped when there is none (HF behaviour).
  void EncodeWord(std::string_view word, std::vector<int32_t>* ids) const;

 private:
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };
  static constexpr size_t kNumShards = 16;
  struct CacheShard {
    mutable absl::Mutex mu;
    absl::flat_hash_map<std::string, std::vector<int32_t>> words ABSL_GUARDED_BY(mu);
  };

  BpeModel() = default;
  void EncodeUncached(std::string_view word, std::vector<int32_t>* ids) const;
  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  Options options_;
  std::array<int32_t, 256> byte_ids_;  // id of each single-byte token, -1 if absent
  absl::flat_hash_map<uint64_t, Merge> merges_;
  // Raw-byte spelling -> id, for ignore_merges only.
  absl::flat_hash_map<std::string, int32_t> bytes_to_id_;
  mutable std::array<CacheShard, kNumShards> cache_;
};

}  // namespace dcf
