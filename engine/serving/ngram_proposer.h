// Prompt-lookup drafting for speculative decoding (vLLM's n-gram proposer, llama.cpp's
// lookup decoding): find the longest suffix of a sequence's tokens (prompt + output), between
// min_n and max_n tokens long, that also occurred earlier in them, and propose the tokens
// that followed its most recent earlier occurrence.
//
// The index is updated incrementally: each call adds the n-grams of the tokens appended
// since the last one (O(max_n - min_n + 1) hash inserts per token), so proposing costs the
// same whatever the context length; nothing is rescanned. Tokens only ever grow (a
// preempted sequence keeps them), which is all the index assumes.
//
// Not thread-safe: one per sequence, used by the engine loop.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"

namespace dcf {

struct NgramOptions {
  int min_n = 2;  // shortest suffix matched, >= 1
  int max_n = 4;  // longest, >= min_n
};

class NgramProposer {
 public:
  explicit NgramProposer(const NgramOptions& options);

  // Up to `max_tokens` tokens proposed to follow `tokens` (which extend the tokens of the
  // previous call), written to `draft` (cleared first). Empty when no suffix of length
  // >= min_n occurred before, or max_tokens <= 0. The proposal never goes past the end of
  // `tokens` (an occurrence near the end proposes fewer).
  void Propose(absl::Span<const int32_t> tokens, int max_tokens, std::vector<int32_t>* draft);

 private:
  // Hash of tokens[end - n, end).
  static uint64_t Hash(absl::Span<const int32_t> tokens, int end, int n);
  // Adds the n-grams that end at `end` (continuation position `end`) for every n.
  void Index(absl::Span<const int32_t> tokens, int end);

  NgramOptions options_;
  int indexed_ = 0;  // n-grams ending at positions below this are in the maps
  // [max_n - min_n + 1] per length: hash of an n-gram -> the position right after its most
  // recent indexed occurrence.
  std::vector<absl::flat_hash_map<uint64_t, int32_t>> last_;
};

}  // namespace dcf
