#include "engine/kv/block_hash.h"

#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"

namespace dcf {
namespace {

// The reference implementation's vectors (github.com/veorq/SipHash, vectors.h,
// vectors_sip128): key 00 01 .. 0f, message 00 01 .. (n - 1), 16 output bytes.
struct Vector {
  int len;
  uint8_t out[16];
};
const Vector kVectors[] = {
    {0, {0xa3, 0x81, 0x7f, 0x04, 0xba, 0x25, 0xa8, 0xe6, 0x6d, 0xf6, 0x72, 0x14, 0xc7, 0x55,
         0x02, 0x93}},
    {1, {0xda, 0x87, 0xc1, 0xd8, 0x6b, 0x99, 0xaf, 0x44, 0x34, 0x76, 0x59, 0x11, 0x9b, 0x22,
         0xfc, 0x45}},
    {7, {0xa1, 0xf1, 0xeb, 0xbe, 0xd8, 0xdb, 0xc1, 0x53, 0xc0, 0xb8, 0x4a, 0xa6, 0x1f, 0xf0,
         0x82, 0x39}},
    {8, {0x3b, 0x62, 0xa9, 0xba, 0x62, 0x58, 0xf5, 0x61, 0x0f, 0x83, 0xe2, 0x64, 0xf3, 0x14,
         0x97, 0xb4}},
    {15, {0x54, 0x93, 0xe9, 0x99, 0x33, 0xb0, 0xa8, 0x11, 0x7e, 0x08, 0xec, 0x0f, 0x97, 0xcf,
          0xc3, 0xd9}},
    {16, {0x6e, 0xe2, 0xa4, 0xca, 0x67, 0xb0, 0x54, 0xbb, 0xfd, 0x33, 0x15, 0xbf, 0x85, 0x23,
          0x05, 0x77}},
    {63, {0x51, 0x50, 0xd1, 0x77, 0x2f, 0x50, 0x83, 0x4a, 0x50, 0x3e, 0x06, 0x9a, 0x97, 0x3f,
          0xbd, 0x7c}},
};

uint64_t Le64(const uint8_t* p) {
  uint64_t x = 0;
  for (int i = 7; i >= 0; --i) x = (x << 8) | p[i];
  return x;
}

TEST(SipHash128Test, MatchesTheReferenceVectors) {
  uint8_t key_bytes[16];
  for (int i = 0; i < 16; ++i) key_bytes[i] = static_cast<uint8_t>(i);
  const std::array<uint64_t, 2> key = {Le64(key_bytes), Le64(key_bytes + 8)};
  std::vector<uint8_t> msg(64);
  for (int i = 0; i < 64; ++i) msg[i] = static_cast<uint8_t>(i);
  for (const Vector& v : kVectors) {
    const std::array<uint64_t, 2> h = SipHash128(key, msg.data(), v.len);
    EXPECT_EQ(h[0], Le64(v.out)) << "length " << v.len;
    EXPECT_EQ(h[1], Le64(v.out + 8)) << "length " << v.len;
  }
}

TEST(BlockHashTest, NamesTheWholePrefixAndTheSalt) {
  EXPECT_EQ(SaltRoot(""), BlockHash{});
  const BlockHash a = SaltRoot("tenant-a"), b = SaltRoot("tenant-b");
  EXPECT_NE(a, BlockHash{});
  EXPECT_NE(a, b);
  EXPECT_EQ(a, SaltRoot("tenant-a"));  // one key per process
  const std::vector<int32_t> t1 = {1, 2, 3, 4}, t2 = {1, 2, 3, 5};
  absl::flat_hash_set<BlockHash> seen;
  for (const BlockHash& root : {BlockHash{}, a, b}) {
    const BlockHash h1 = HashBlock(root, t1);
    EXPECT_EQ(h1, HashBlock(root, t1));
    seen.insert(h1);
    seen.insert(HashBlock(root, t2));
    seen.insert(HashBlock(h1, t1));  // the same tokens after another parent
  }
  EXPECT_EQ(seen.size(), 9u);
  // Token ids are hashed as 32-bit values, not bytes: 256 differs from 0.
  EXPECT_NE(HashBlock(BlockHash{}, std::vector<int32_t>{256}),
            HashBlock(BlockHash{}, std::vector<int32_t>{0}));
}

}  // namespace
}  // namespace dcf
