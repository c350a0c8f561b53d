// Hashes that name the contents of a KV-cache block for prefix caching (kv_cache_manager.h).
//
// A full block i of a sequence is named by a chain: h_i = H(h_{i-1}, tokens of block i) with
// h_{-1} = the root of the request's cache_salt. Since K, V and the key-side compose terms of
// a position depend only on the tokens up to it, two blocks with the same h_i hold the same
// rows, whichever request computed them. H is SipHash-2-4 with a 128-bit output, keyed with a
// random key drawn once per process: a client cannot construct two prompts whose blocks
// collide without knowing the key, and an accidental collision among n cached blocks has
// probability about n^2 / 2^129.
//
// Pure functions, thread-safe (the key is drawn on first use, under the C++ static-init lock).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace dcf {

struct BlockHash {
  uint64_t lo = 0;
  uint64_t hi = 0;

  friend bool operator==(const BlockHash& a, const BlockHash& b) {
    return a.lo == b.lo && a.hi == b.hi;
  }
  friend bool operator!=(const BlockHash& a, const BlockHash& b) { return !(a == b); }
  template <typename H>
  friend H AbslHashValue(H h, const BlockHash& b) {
    return H::combine(std::move(h), b.lo, b.hi);
  }
};

// The root of the chain of a request with this cache_salt: all zero for the empty salt (the
// requests that set none share their prefixes), a keyed hash of the salt otherwise, so that
// requests with different salts never name a block alike.
BlockHash SaltRoot(absl::string_view salt);

// h_i from h_{i-1} (`parent`, or the root for block 0) and the ids of block i.
BlockHash HashBlock(const BlockHash& parent, absl::Span<const int32_t> tokens);

// SipHash-2-4 with a 128-bit output (Aumasson and Bernstein, "SipHash: a fast short-input
// PRF"), of `data` under `key` (k0, k1 = the key's bytes 0-7 and 8-15, little endian).
// Returns (out0, out1): the output's bytes 0-7 and 8-15, little endian. Exposed for its
// reference test vectors.
std::array<uint64_t, 2> SipHash128(const std::array<uint64_t, 2>& key, const uint8_t* data,
                                   size_t len);

}  // namespace dcf
