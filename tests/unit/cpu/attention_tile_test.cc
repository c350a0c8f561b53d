// The query-tiled prefill attention (cpu::AttendTile, and cpu::PagedAttention, which uses it
// for chunks of several tokens) against the per-query path it replaces (cpu::AttendOne), bit
// for bit: window and global layers, MHA and DCMHA, head counts and head dims that are and are
// not multiples of the vector width, 16-bit cache rows, tiles cut anywhere; and a prompt
// prefilled through the paged cache in one chunk, in many chunks or token by token gives the
// same bits.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/cpu/dcmha.h"
#include "engine/cpu/paged_attention.h"
#include "engine/cpu/team.h"
#include "engine/kv/kv_cache_manager.h"
#include "engine/model/model_config.h"
#include "gtest/gtest.h"

namespace dcf::cpu {
namespace {

constexpr int C = ModelConfig::kComposeBranches;
constexpr int kI = ModelConfig::kRank;

std::vector<Isa> TestIsas() {
  std::vector<Isa> isas = {Isa::kPortable};
  if (SupportedIsa(Isa::kAvx512) == Isa::kAvx512) isas.push_back(Isa::kAvx512);
  return isas;
}

// Without AVX-512 the tiled kernel does not exist (AttendTile attends query by query), so the
// comparisons below only check the tile's per-query indexing: said, not hidden.
TEST(AttentionTileTest, TiledKernelRunsOnThisCpu) {
  if (SupportedIsa(Isa::kAvx512) != Isa::kAvx512) {
    GTEST_SKIP() << "no AVX-512 on this CPU: the tiled kernel is not compared here";
  }
  EXPECT_EQ(TestIsas().back(), Isa::kAvx512);
}

uint32_t Bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// Rows of `dtype` holding random values (16-bit: rounded), as uint16_t or float storage.
struct Rows {
  std::vector<float> f32;
  std::vector<uint16_t> u16;
  DType dtype = DType::kF32;
  const void* data(int64_t element) const {
    return dtype == DType::kF32 ? static_cast<const void*>(f32.data() + element)
                                : static_cast<const void*>(u16.data() + element);
  }
};

Rows RandomRows(DType dtype, int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1, 1);
  Rows r;
  r.dtype = dtype;
  if (dtype == DType::kF32) {
    r.f32.resize(n);
    for (float& x : r.f32) x = u(rng);
  } else {
    r.u16.resize(n);
    for (uint16_t& x : r.u16) x = dtype == DType::kBF16 ? FloatToBF16(u(rng)) : FloatToHalf(u(rng));
  }
  return r;
}

// The keys 0..P-1 (P > 64) of `rows` (rows `row` elements apart) as a decode step sees them:
// four cache blocks of 16, then the rest as one ragged segment (a chunk's fresh rows).
std::vector<KeySegment> BlocksThenFresh(const Rows& rows, int P, int row) {
  std::vector<KeySegment> segs;
  for (int p0 = 0; p0 < 64; p0 += 16) {
    segs.push_back({p0, 16, rows.data(static_cast<int64_t>(p0) * row), row, rows.dtype});
  }
  segs.push_back({64, P - 64, rows.data(64 * row), row, rows.dtype});
  return segs;
}

// Per-token query-side inputs of T tokens: q [T, N*hd], dw [T, C, 2I, N], g [T, C, N].
struct Queries {
  std::vector<float> q, dw, g;
};

Queries RandomQueries(int T, int N, int hd, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1, 1);
  Queries x;
  x.q.resize(static_cast<size_t>(T) * N * hd);
  x.dw.resize(static_cast<size_t>(T) * C * 2 * kI * N);
  x.g.resize(static_cast<size_t>(T) * C * N);
  for (float& v : x.q) v = 2 * u(rng);
  for (float& v : x.dw) v = 0.5f * u(rng);
  for (float& v : x.g) v = 0.5f * u(rng);
  return x;
}

// AttendTile over every tile of [first, first + count) against AttendOne query by query, on
// keys in segments of 16 (cache blocks) followed by a ragged one (a chunk's fresh rows).
TEST(AttendTileTest, EqualsAttendOneForEveryQueryBitForBit) {
  std::mt19937 rng(21);
  int compared = 0;
  for (const Isa isa : TestIsas()) {
    for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (const auto& [N, hd] : {std::pair{8, 64}, std::pair{1, 16}, std::pair{20, 20},
                                  std::pair{32, 80}, std::pair{5, 128}, std::pair{3, 8},
                                  std::pair{7, 96}, std::pair{4, 33}}) {
        const KvRowLayout layout(N, hd);
        const int row = layout.row_floats();
        const int P = 75;  // keys 0..74
        const Rows rows = RandomRows(dtype, static_cast<int64_t>(P) * row, rng);
        const std::vector<KeySegment> segs = BlocksThenFresh(rows, P, row);
        const Queries qs = RandomQueries(P, N, hd, rng);
        std::vector<float> tile_scratch(AttendTileScratchFloats(layout, P));
        std::vector<float> one_scratch(AttendScratchFloats(layout, P));
        for (const int window : {0, 1, 7, 40}) {
          for (const bool compose : {true, false}) {
            // Tiles of 1 to 32 queries (1 or 2 lane groups, the last one full or not)
            // starting at unaligned and aligned positions.
            for (const auto& [pos0, count] :
                 {std::pair{0, 16}, std::pair{3, 16}, std::pair{59, 16}, std::pair{17, 5},
                  std::pair{74, 1}, std::pair{0, 1}, std::pair{40, 13}, std::pair{11, 32},
                  std::pair{0, 31}, std::pair{30, 27}, std::pair{43, 32}}) {
              QueryTile tile;
              tile.count = count;
              tile.pos0 = pos0;
              tile.window = window;
              tile.q = qs.q.data() + static_cast<int64_t>(pos0) * N * hd;
              tile.q_stride = N * hd;
              tile.dw = qs.dw.data() + static_cast<int64_t>(pos0) * C * 2 * kI * N;
              tile.g = qs.g.data() + static_cast<int64_t>(pos0) * C * N;
              tile.g_stride = C * N;
              tile.compose = compose;
              const int64_t E = static_cast<int64_t>(N) * hd;
              std::vector<float> got(count * E, -7.0f), want(E);
              AttendTile(layout, tile, segs, tile_scratch.data(), got.data(), E, isa);
              for (int i = 0; i < count; ++i) {
                const int64_t t = pos0 + i;
                QueryInputs qi;
                qi.q = qs.q.data() + t * E;
                qi.pre_w = qs.dw.data() + (t * C + 0) * 2 * kI * N;
                qi.post_w = qs.dw.data() + (t * C + 2) * 2 * kI * N;
                qi.pre_g = qs.g.data() + t * C * N + 0 * N;
                qi.post_g = qs.g.data() + t * C * N + 2 * N;
                qi.compose = compose;
                AttendOne(layout, qi, segs, FirstKeptPosition(window, static_cast<int>(t)), t,
                          one_scratch.data(), want.data(), isa);
                for (int64_t e = 0; e < E; ++e) {
                  ASSERT_EQ(Bits(got[i * E + e]), Bits(want[e]))
                      << IsaName(isa) << " " << DTypeName(dtype) << " N " << N << " hd " << hd
                      << " window " << window << " compose " << compose << " tile " << pos0 << "+"
                      << count << " query " << t << " element " << e << ": " << got[i * E + e]
                      << " vs " << want[e];
                }
                ++compared;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(compared, static_cast<int>(TestIsas().size()) * 3 * 8 * 4 * 2 *
                          (16 * 3 + 5 + 1 + 1 + 13 + 32 + 31 + 27 + 32));
}

// One query split between the threads of a team (a batch-1 decode step) against the same
// query on one thread: 1, 2, 3, 7, 64 and 75 keys (fewer pairs of keys than threads, odd and
// even counts), every dtype, six head counts and head dims of the test above, teams of 1-4
// threads.
TEST(AttendOneTest, OnATeamGivesTheBitsOfOneThread) {
  std::mt19937 rng(31);
  int compared = 0;
  for (const Isa isa : TestIsas()) {
    for (const DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (const auto& [N, hd] : {std::pair{8, 64}, std::pair{1, 16}, std::pair{20, 20},
                                  std::pair{32, 80}, std::pair{5, 128}, std::pair{7, 96}}) {
        const KvRowLayout layout(N, hd);
        const int row = layout.row_floats();
        const int P = 75;
        const Rows rows = RandomRows(dtype, static_cast<int64_t>(P) * row, rng);
        const std::vector<KeySegment> segs = BlocksThenFresh(rows, P, row);
        const Queries qs = RandomQueries(1, N, hd, rng);
        QueryInputs qi;
        qi.q = qs.q.data();
        qi.pre_w = qs.dw.data();
        qi.pre_g = qs.g.data();
        qi.post_w = qs.dw.data() + 2 * 2 * kI * N;
        qi.post_g = qs.g.data() + 2 * N;
        for (const auto& [lo, hi] : {std::pair{0, 0}, std::pair{0, 1}, std::pair{3, 5},
                                     std::pair{10, 16}, std::pair{0, 74}, std::pair{11, 74}}) {
          std::vector<float> scratch(AttendScratchFloats(layout, hi - lo + 1));
          std::vector<float> want(static_cast<size_t>(N) * hd);
          AttendOne(layout, qi, segs, lo, hi, scratch.data(), want.data(), isa);
          for (const int size : {1, 2, 3, 4}) {
            std::vector<float> got(want.size(), -7.0f);
            std::fill(scratch.begin(), scratch.end(), 0.0f);
            TeamState state;
            state.Reset();
            auto run = [&](int rank) {
              Team team(&state, rank, size);
              AttendOne(team, layout, qi, segs, lo, hi, scratch.data(), got.data(), isa);
            };
            std::vector<std::thread> others;
            for (int r = 1; r < size; ++r) others.emplace_back(run, r);
            run(0);
            for (std::thread& t : others) t.join();
            for (size_t e = 0; e < want.size(); ++e) {
              ASSERT_EQ(Bits(got[e]), Bits(want[e]))
                  << IsaName(isa) << " " << DTypeName(dtype) << " N " << N << " hd " << hd
                  << " keys " << lo << ".." << hi << " team " << size << " at " << e;
            }
            ++compared;
          }
        }
      }
    }
  }
  EXPECT_EQ(compared, static_cast<int>(TestIsas().size()) * 3 * 6 * 6 * 4);
}

// One layer's prompt through PagedAttention and a paged cache (block 16), cut into chunks in
// several ways, with tiles on and off: every chunking gives the bits of the prompt in one
// chunk with tiles off (the per-query path), for every position.
struct ChunkCase {
  int n_head, head_dim, length, window;
  bool compose;
  DType dtype;
};

// team 0: PagedAttention on its own threads; else PagedAttention(team, ...) on a team of that
// many std::threads.
std::vector<float> Prefill(const ChunkCase& c, const Rows& rows, const Queries& qs,
                           const std::vector<int>& chunks, bool tiles, int team = 0) {
  const KvRowLayout layout(c.n_head, c.head_dim);
  const int row = layout.row_floats();
  const int B = 16;
  const int N = c.n_head;
  const int64_t E = static_cast<int64_t>(N) * c.head_dim;
  const int blocks = (c.length + B - 1) / B;
  // The cache: block b holds positions [16 b, 16 b + 16) in reverse block order (tables
  // matter, not where the blocks lie).
  Rows cache;
  cache.dtype = c.dtype;
  if (c.dtype == DType::kF32) {
    cache.f32.assign(static_cast<size_t>(blocks) * B * row, 0.0f);
  } else {
    cache.u16.assign(static_cast<size_t>(blocks) * B * row, 0);
  }
  std::vector<int32_t> table(blocks);
  for (int b = 0; b < blocks; ++b) table[b] = blocks - 1 - b;
  std::vector<float> out(static_cast<size_t>(c.length) * E, -7.0f);
  int start = 0;
  for (size_t k = 0; start < c.length; ++k) {
    const int n = std::min(chunks[k % chunks.size()], c.length - start);
    PagedSequence seq{start, n, 0, table.data()};
    std::vector<int64_t> positions(n);
    std::vector<int32_t> seq_of(n, 0);
    for (int i = 0; i < n; ++i) positions[i] = start + i;
    PagedAttentionInputs in;
    in.layout = layout;
    in.window = c.window;
    in.compose = c.compose;
    in.query_tiles = tiles;
    in.seqs = &seq;
    in.num_seqs = 1;
    in.positions = positions.data();
    in.seq_of = seq_of.data();
    in.num_tokens = n;
    in.rows = rows.data(static_cast<int64_t>(start) * row);
    in.q = qs.q.data() + start * E;
    in.q_stride = E;
    in.dw = qs.dw.data() + static_cast<int64_t>(start) * C * 2 * kI * N;
    in.g = qs.g.data() + static_cast<int64_t>(start) * C * N;
    in.g_stride = C * N;
    in.cache.base = const_cast<void*>(cache.data(0));
    in.cache.block_size = B;
    in.cache.dtype = c.dtype;
    if (team == 0) {
      PagedAttention(in, out.data() + start * E);
    } else {
      TeamState state;
      state.Reset();
      PagedAttentionWork work;
      auto run = [&](int rank) {
        Team t(&state, rank, team);
        PagedAttention(t, in, &work, out.data() + start * E);
      };
      std::vector<std::thread> others;
      for (int r = 1; r < team; ++r) others.emplace_back(run, r);
      run(0);
      for (std::thread& t : others) t.join();
    }
    start += n;
  }
  return out;
}

TEST(PagedAttentionTest, TiledPrefillIsBitIdenticalWhateverTheChunking) {
  std::mt19937 rng(5);
  const std::vector<std::vector<int>> chunkings = {
      {1000}, {1}, {16}, {7, 16, 1, 33}, {17, 3, 64, 5}, {50, 2}, {4, 4, 9}};
  const ChunkCase cases[] = {
      {8, 64, 100, 0, true, DType::kF32},  {8, 64, 100, 24, true, DType::kF32},
      {8, 64, 100, 0, false, DType::kF32}, {8, 64, 77, 24, false, DType::kF32},
      {5, 20, 83, 0, true, DType::kBF16},  {5, 20, 83, 16, true, DType::kF16},
      {32, 80, 47, 0, true, DType::kF32},  {32, 80, 47, 9, true, DType::kBF16},
      {8, 64, 16, 0, true, DType::kF32},   {8, 64, 130, 37, true, DType::kF32}};
  for (const ChunkCase& c : cases) {
    const KvRowLayout layout(c.n_head, c.head_dim);
    const Rows rows =
        RandomRows(c.dtype, static_cast<int64_t>(c.length) * layout.row_floats(), rng);
    const Queries qs = RandomQueries(c.length, c.n_head, c.head_dim, rng);
    const std::vector<float> want = Prefill(c, rows, qs, {c.length}, /*tiles=*/false);
    for (const float x : want) ASSERT_NE(x, -7.0f);  // every output written
    for (const bool tiles : {true, false}) {
      for (const std::vector<int>& chunks : chunkings) {
        const std::vector<float> got = Prefill(c, rows, qs, chunks, tiles);
        std::string name = "N " + std::to_string(c.n_head) + " hd " + std::to_string(c.head_dim) +
                           " L " + std::to_string(c.length) + " window " +
                           std::to_string(c.window) + " compose " + std::to_string(c.compose) +
                           " " + std::string(DTypeName(c.dtype)) + " tiles " +
                           std::to_string(tiles) + " chunks";
        for (int k : chunks) name.append(" ").append(std::to_string(k));
        for (size_t e = 0; e < want.size(); ++e) {
          ASSERT_EQ(Bits(got[e]), Bits(want[e])) << name << " at element " << e;
        }
      }
    }
  }
}

// The same prompts on teams of threads (a CPU backend step runs attention on its team):
// the bits of the per-query path in one chunk, whichever thread takes which item.
TEST(PagedAttentionTest, OnATeamOfThreadsGivesTheSameBits) {
  std::mt19937 rng(8);
  const ChunkCase cases[] = {{8, 64, 100, 24, true, DType::kF32},
                             {5, 20, 83, 16, true, DType::kF16},
                             {32, 80, 47, 0, true, DType::kBF16}};
  int compared = 0;
  for (const ChunkCase& c : cases) {
    const KvRowLayout layout(c.n_head, c.head_dim);
    const Rows rows =
        RandomRows(c.dtype, static_cast<int64_t>(c.length) * layout.row_floats(), rng);
    const Queries qs = RandomQueries(c.length, c.n_head, c.head_dim, rng);
    const std::vector<float> want = Prefill(c, rows, qs, {c.length}, /*tiles=*/false);
    for (const int team : {1, 2, 3}) {
      for (const std::vector<int>& chunks :
           std::vector<std::vector<int>>{{1000}, {1}, {7, 16, 1, 33}}) {
        const std::vector<float> got = Prefill(c, rows, qs, chunks, /*tiles=*/true, team);
        for (size_t e = 0; e < want.size(); ++e) {
          ASSERT_EQ(Bits(got[e]), Bits(want[e]))
              << "N " << c.n_head << " team " << team << " first chunk " << chunks[0]
              << " at element " << e;
        }
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 3 * 3 * 3);
}

}  // namespace
}  // namespace dcf::cpu
