#include "engine/cpu/paged_attention.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string_view>

#include "engine/kv/kv_cache_manager.h"
#include "engine/model/model_config.h"

namespace dcf::cpu {
namespace {

constexpr int C = ModelConfig::kComposeBranches;
constexpr int kI = ModelConfig::kRank;

// Chunks of fewer new tokens attend query by query (a decode token; tiles pay off from a few
// queries on).
constexpr int kMinTileQueries = 4;

// DCF_CPU_QUERY_TILES=0 turns the tiles off process-wide (the per-query reference path, for
// before/after measurements of whole models in one binary).
bool QueryTilesAllowed() {
  static const bool allowed = [] {
    const char* v = std::getenv("DCF_CPU_QUERY_TILES");
    return v == nullptr || std::string_view(v) != "0";
  }();
  return allowed;
}

// Whether sequence sp's queries attend in tiles.
bool UsesTiles(const PagedAttentionInputs& in, const PagedSequence& sp) {
  return in.query_tiles && QueryTilesAllowed() && sp.num_tokens >= kMinTileQueries;
}

// Floats of the scratch each thread of PagedAttention(in) allocates.
int64_t ScratchFloats(const PagedAttentionInputs& in) {
  int64_t max_keys = 0;
  for (int64_t t = 0; t < in.num_tokens; ++t) {
    max_keys = std::max<int64_t>(
        max_keys, in.positions[t] - FirstKeptPosition(in.window, in.positions[t]) + 1);
  }
  bool any_tile = false;
  for (int i = 0; i < in.num_seqs; ++i) any_tile |= UsesTiles(in, in.seqs[i]);
  return any_tile ? AttendTileScratchFloats(in.layout, max_keys)
                  : AttendScratchFloats(in.layout, max_keys);
}

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int64_t PagedAttentionScratchBytes(const PagedAttentionInputs& in) {
  return static_cast<int64_t>(omp_get_max_threads()) * ScratchFloats(in) *
         static_cast<int64_t>(sizeof(float));
}

namespace {

// Whether `work` on a team of `threads` splits its one query between them (a batch-1 decode
// step), in work.shared_scratch.
bool SplitsOneQuery(const PagedAttentionWork& work, int threads) {
  return threads > 1 && work.items.size() == 1 && work.items[0].count == 1;
}

// Stores the new rows, describes every sequence's keys as segments and cuts the queries into
// work items for `threads` threads.
void Plan(const PagedAttentionInputs& in, int threads, PagedAttentionWork* work) {
  const KvRowLayout& layout = in.layout;
  const int row = layout.row_floats();
  const int B = in.cache.block_size;
  const int window = in.window;
  const DType dtype = in.cache.dtype;
  const int64_t row_bytes = static_cast<int64_t>(row) * DTypeSize(dtype);
  const char* fresh = static_cast<const char*>(in.rows);  // [T, row] of dtype

  std::vector<std::vector<KeySegment>>& segments = work->segments;
  segments.resize(in.num_seqs);
  for (int i = 0; i < in.num_seqs; ++i) {
    const PagedSequence& sp = in.seqs[i];
    const int n = sp.num_tokens;
    const int end = sp.start_pos + n;
    const int64_t t0i = sp.first_token;
    // Every new row goes into the block its table names; none where there is no block (a
    // window position no later query reads, unless prefix caching keeps the whole block).
    for (int p = sp.start_pos; p < end; ++p) {
      const int32_t blk = sp.table[p / B];
      if (blk == kNoBlock) continue;
      std::memcpy(in.cache.Row(blk, p % B, row), fresh + (t0i + p - sp.start_pos) * row_bytes,
                  row_bytes);
    }
    segments[i].clear();
    const int first = FirstKeptPosition(window, sp.start_pos);
    for (int p0 = first / B * B; p0 < sp.start_pos; p0 += B) {
      const int lo = std::max(p0, first);
      const int hi = std::min(p0 + B, sp.start_pos);
      segments[i].push_back(
          {lo, hi - lo, in.cache.Row(sp.table[p0 / B], lo - p0, row), row, dtype});
    }
    // The chunk's own keys come from the fresh rows, also where no window block keeps them.
    segments[i].push_back({sp.start_pos, n, fresh + t0i * row_bytes, row, dtype});
  }

  // Work items: a tile of up to QueryTile::kMaxQueries consecutive queries of a chunk
  // (AttendTile), or one query (AttendOne: decode tokens, and every query with tiles off).
  // Either gives a query the same bits (dcmha.h), so how a chunk is cut changes nothing.
  // Tiles are as large as they can be while every thread still gets an item (a short chunk,
  // e.g. a verify step's k + 1 queries, as one tile would run on one thread).
  int tile = QueryTile::kMaxQueries;
  for (; tile > 1; tile /= 2) {
    int64_t n = 0;
    for (int i = 0; i < in.num_seqs; ++i) {
      const PagedSequence& sp = in.seqs[i];
      n += UsesTiles(in, sp) ? (sp.num_tokens + tile - 1) / tile : sp.num_tokens;
    }
    if (n >= threads) break;
  }
  std::vector<PagedAttentionWork::Item>& items = work->items;
  items.clear();
  for (int i = 0; i < in.num_seqs; ++i) {
    const PagedSequence& sp = in.seqs[i];
    const int step = UsesTiles(in, sp) ? tile : 1;
    for (int k = 0; k < sp.num_tokens; k += step) {
      items.push_back({i, sp.first_token + k, std::min(step, sp.num_tokens - k)});
    }
  }
  // Later queries see more keys: hand the largest items out first.
  std::reverse(items.begin(), items.end());
  work->scratch_floats = ScratchFloats(in);
}

// The query-side inputs of token t.
QueryInputs QueryOf(const PagedAttentionInputs& in, int64_t t) {
  const int N = in.layout.n_head;
  const int64_t W2I = 2 * kI * N;  // floats of W1|W2 for one branch
  QueryInputs qi;
  qi.q = in.q + t * in.q_stride;
  qi.pre_w = &in.dw[(t * C + 0) * W2I];
  qi.pre_g = &in.g[t * in.g_stride + 0 * N];
  qi.post_w = &in.dw[(t * C + 2) * W2I];
  qi.post_g = &in.g[t * in.g_stride + 2 * N];
  qi.compose = in.compose;
  return qi;
}

// Work item w of `work` into out, with `scratch` (work.scratch_floats floats).
void Attend(const PagedAttentionInputs& in, const PagedAttentionWork& work, int64_t w,
            float* scratch, float* out) {
  const int N = in.layout.n_head;
  const int64_t E = static_cast<int64_t>(N) * in.layout.head_dim;
  const int64_t W2I = 2 * kI * N;  // floats of W1|W2 for one branch
  const PagedAttentionWork::Item& it = work.items[w];
  const int64_t t = it.token;
  const auto segments = absl::MakeConstSpan(work.segments[it.seq]);
  if (it.count > 1) {
    QueryTile tile;
    tile.count = it.count;
    tile.pos0 = in.positions[t];
    tile.window = in.window;
    tile.q = in.q + t * in.q_stride;
    tile.q_stride = in.q_stride;
    tile.dw = &in.dw[t * C * W2I];
    tile.g = in.g + t * in.g_stride;
    tile.g_stride = in.g_stride;
    tile.compose = in.compose;
    AttendTile(in.layout, tile, segments, scratch, out + t * E, E);
    return;
  }
  const int64_t pos = in.positions[t];
  AttendOne(in.layout, QueryOf(in, t), segments, FirstKeptPosition(in.window, pos), pos, scratch,
            out + t * E);
}

// The items of `work` on the threads of `team`, each with its own scratch; one query on all
// of them.
void AttendItems(Team& team, const PagedAttentionInputs& in, PagedAttentionWork& work,
                 float* out) {
  if (SplitsOneQuery(work, team.size())) {
    const PagedAttentionWork::Item& it = work.items[0];
    const int64_t t = it.token, pos = in.positions[t];
    const int64_t E = static_cast<int64_t>(in.layout.n_head) * in.layout.head_dim;
    AttendOne(team, in.layout, QueryOf(in, t), work.segments[it.seq],
              FirstKeptPosition(in.window, pos), pos, work.shared_scratch.data(), out + t * E);
    return;
  }
  std::unique_ptr<float[]> scratch;  // at this thread's first item
  team.ForEach(static_cast<int64_t>(work.items.size()), [&](int64_t w) {
    if (scratch == nullptr) scratch.reset(new float[work.scratch_floats]);
    Attend(in, work, w, scratch.get(), out);
  });
}

}  // namespace

void PagedAttention(const PagedAttentionInputs& in, float* out, PagedAttentionTimes* times) {
  auto t0 = std::chrono::steady_clock::now();
  PagedAttentionWork work;
  const int threads = omp_get_max_threads();
  Plan(in, threads, &work);
  if (times != nullptr) {
    times->cache_write += Since(t0);
    t0 = std::chrono::steady_clock::now();
  }
  // One query (batch-1 decode) stays on the calling thread.
  RunTeam(work.items.size() > 1 ? threads : 1,
          [&](Team& team) { AttendItems(team, in, work, out); });
  if (times != nullptr) times->attention += Since(t0);
}

void PagedAttention(Team& team, const PagedAttentionInputs& in, PagedAttentionWork* work,
                    float* out, PagedAttentionTimes* times) {
  auto t0 = std::chrono::steady_clock::now();
  if (team.leader()) {
    Plan(in, team.size(), work);
    if (SplitsOneQuery(*work, team.size()) &&
        work->shared_scratch.size() < static_cast<size_t>(work->scratch_floats)) {
      work->shared_scratch.resize(work->scratch_floats);
    }
    if (times != nullptr) {
      times->cache_write += Since(t0);
      t0 = std::chrono::steady_clock::now();
    }
  }
  team.Barrier();
  AttendItems(team, in, *work, out);
  if (team.leader() && times != nullptr) times->attention += Since(t0);
}

}  // namespace dcf::cpu
