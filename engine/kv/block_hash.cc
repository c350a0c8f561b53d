#include "engine/kv/block_hash.h"

#include <cstring>
#include <random>
#include <vector>

namespace dcf {
namespace {

inline uint64_t Rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

inline void SipRound(uint64_t& v0, uint64_t& v1, uint64_t& v2, uint64_t& v3) {
  v0 += v1;
  v1 = Rotl(v1, 13);
  v1 ^= v0;
  v0 = Rotl(v0, 32);
  v2 += v3;
  v3 = Rotl(v3, 16);
  v3 ^= v2;
  v0 += v3;
  v3 = Rotl(v3, 21);
  v3 ^= v0;
  v2 += v1;
  v1 = Rotl(v1, 17);
  v1 ^= v2;
  v2 = Rotl(v2, 32);
}

inline uint64_t LoadLe64(const uint8_t* p) {
  uint64_t x = 0;
  for (int i = 7; i >= 0; --i) x = (x << 8) | p[i];
  return x;
}

// The process's key: 128 bits from the OS's entropy source, drawn once.
const std::array<uint64_t, 2>& ProcessKey() {
  static const std::array<uint64_t, 2> key = [] {
    std::random_device rd;
    std::array<uint64_t, 2> k{};
    for (uint64_t& w : k) w = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    return k;
  }();
  return key;
}

// `domain` separates salts from blocks: each gets its own key, so no salt's root can equal
// a block's hash by construction of the input.
BlockHash Hash(const std::vector<uint8_t>& bytes, uint64_t domain) {
  std::array<uint64_t, 2> key = ProcessKey();
  key[0] ^= domain;
  const std::array<uint64_t, 2> h = SipHash128(key, bytes.data(), bytes.size());
  return BlockHash{h[0], h[1]};
}

void AppendLe64(uint64_t x, std::vector<uint8_t>* out) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<uint8_t>(x >> (8 * i)));
}

}  // namespace

std::array<uint64_t, 2> SipHash128(const std::array<uint64_t, 2>& key, const uint8_t* data,
                                   size_t len) {
  const uint64_t k0 = key[0], k1 = key[1];
  uint64_t v0 = k0 ^ 0x736f6d6570736575ULL;
  uint64_t v1 = k1 ^ 0x646f72616e646f6dULL;
  uint64_t v2 = k0 ^ 0x6c7967656e657261ULL;
  uint64_t v3 = k1 ^ 0x7465646279746573ULL;
  v1 ^= 0xee;  // the 128-bit variant
  const size_t full = len / 8 * 8;
  for (size_t i = 0; i < full; i += 8) {
    const uint64_t m = LoadLe64(data + i);
    v3 ^= m;
    SipRound(v0, v1, v2, v3);
    SipRound(v0, v1, v2, v3);
    v0 ^= m;
  }
  // The last word: the remaining bytes, with the length's low byte on top.
  uint64_t b = static_cast<uint64_t>(len) << 56;
  for (size_t i = full; i < len; ++i) b |= static_cast<uint64_t>(data[i]) << (8 * (i - full));
  v3 ^= b;
  SipRound(v0, v1, v2, v3);
  SipRound(v0, v1, v2, v3);
  v0 ^= b;
  v2 ^= 0xee;
  for (int r = 0; r < 4; ++r) SipRound(v0, v1, v2, v3);
  const uint64_t out0 = v0 ^ v1 ^ v2 ^ v3;
  v1 ^= 0xdd;
  for (int r = 0; r < 4; ++r) SipRound(v0, v1, v2, v3);
  const uint64_t out1 = v0 ^ v1 ^ v2 ^ v3;
  return {out0, out1};
}

BlockHash SaltRoot(absl::string_view salt) {
  if (salt.empty()) return BlockHash{};
  const std::vector<uint8_t> bytes(salt.begin(), salt.end());
  return Hash(bytes, /*domain=*/1);
}

BlockHash HashBlock(const BlockHash& parent, absl::Span<const int32_t> tokens) {
  std::vector<uint8_t> bytes;
  bytes.reserve(16 + 4 * tokens.size());
  AppendLe64(parent.lo, &bytes);
  AppendLe64(parent.hi, &bytes);
  for (int32_t t : tokens) {
    const uint32_t u = static_cast<uint32_t>(t);
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<uint8_t>(u >> (8 * i)));
  }
  return Hash(bytes, /*domain=*/0);
}

}  // namespace dcf
