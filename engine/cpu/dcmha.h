// DCMHA attention of one query over cached keys on the CPU (DCFORMER.md section 4).
//
// Compose mixes the heads' scores at the same (query, key) pair, so a query's scores for all
// heads are materialised per key: S [L, N] for its L visible keys.
#pragma once

#include <cstdint>

#include "absl/types/span.h"
#include "engine/cpu/cpu_isa.h"
#include "engine/cpu/team.h"
#include "engine/kv/kv_layout.h"
#include "engine/weights/dtype.h"

namespace dcf::cpu {

// Compose of a head vector s[N] with query-side terms (qw = W1 [I][N] then W2 [I][N], qg =
// G [N]) and key-side terms (kw, kg likewise):
//   out[m] = s[m] (1 + qg[m] + kg[m]) + sum_i W2q[i][m] <W1q[i], s> + sum_i W2k[i][m] <W1k[i], s>
// `out` may alias `s`.
void Compose(int n_head, const float* qw, const float* qg, const float* kw, const float* kg,
             const float* s, float* out);

// A run of consecutive cached positions [pos0, pos0 + count) whose rows (KvRowLayout) are
// `stride` elements apart starting at `rows`, each element of `dtype` (the KV cache dtype:
// F32, or BF16 / F16 bits, widened exactly to f32 as they are read).
struct KeySegment {
  int64_t pos0 = 0;
  int64_t count = 0;
  const void* rows = nullptr;
  int64_t stride = 0;
  DType dtype = DType::kF32;
};

// Query-side inputs of one token.
struct QueryInputs {
  const float* q = nullptr;       // [N, hd], qk-normed and rotated
  const float* pre_w = nullptr;   // branch 0: W1 [I][N] | W2 [I][N]
  const float* pre_g = nullptr;   // branch 0: G [N]
  const float* post_w = nullptr;  // branch 2
  const float* post_g = nullptr;  // branch 2
  bool compose = true;            // false: plain multi-head attention (benchmarks only)
};

// Floats of AttendOne's scratch for `num_keys` visible keys: per key, its N scores rounded up
// to whole 16-lane vectors and a row pointer; then the N softmax sums, rounded up likewise.
int64_t AttendScratchFloats(const KvRowLayout& layout, int64_t num_keys);

// Attends query `qi` to the visible keys [lo, hi] (inclusive) found in `segments` (which
// must cover that range, all of one dtype) and writes o [N, hd]. A 16-bit row is widened
// exactly, so attending over 16-bit rows is bit-identical to attending over f32 rows that
// hold the same (rounded) values. `scratch` holds
// AttendScratchFloats(layout, hi - lo + 1) floats. `isa` picks the implementation (the
// portable one is the reference; results agree to float rounding).
void AttendOne(const KvRowLayout& layout, const QueryInputs& qi,
               absl::Span<const KeySegment> segments, int64_t lo, int64_t hi, float* scratch,
               float* out, Isa isa = ActiveIsa());

// The same query on the threads of `team` (team.h), every one of which calls it with the same
// arguments and the same `scratch` (a batch-1 decode step's one query on its step's team):
// with AVX-512 the keys of each pass, and the value sums by head group, are split between the
// threads, each key and head group computed as one thread computes it (the same bits); the
// portable kernel runs on the leader. Returns on every thread after a barrier.
void AttendOne(Team& team, const KvRowLayout& layout, const QueryInputs& qi,
               absl::Span<const KeySegment> segments, int64_t lo, int64_t hi, float* scratch,
               float* out, Isa isa = ActiveIsa());

// A tile of consecutive queries of one sequence: query i (i < count) is at position
// pos0 + i and sees the keys [FirstKeptPosition(window, pos0 + i), pos0 + i] (window 0:
// global), as AttendOne's lo and hi. Its inputs are those of a QueryInputs, row i of each:
//   q + i * q_stride                  [N, hd]
//   dw + i * C * 2I * N               [C, 2I, N]: W1 | W2 of every branch (0 pre, 2 post)
//   g + i * g_stride                  [C, N]: G of every branch
struct QueryTile {
  static constexpr int kMaxQueries = 32;  // AVX-512: 2 groups of 16 queries (one per lane)
  int count = 0;                          // 1..kMaxQueries
  int64_t pos0 = 0;
  int window = 0;
  const float* q = nullptr;
  int64_t q_stride = 0;
  const float* dw = nullptr;
  const float* g = nullptr;
  int64_t g_stride = 0;
  bool compose = true;
};

// Floats of AttendTile's scratch for a tile whose queries see at most `max_keys` keys each.
int64_t AttendTileScratchFloats(const KvRowLayout& layout, int64_t max_keys);

// Attends every query of `tile` to its visible keys in `segments` (which must cover them all,
// all of one dtype) and writes query i's o [N, hd] at out + i * out_stride. Bit for bit what
// AttendOne with the same `isa` writes for each query alone (the tiled kernel keeps every
// per-query reduction, over head dims, heads and keys, in AttendOne's order: DESIGN.md,
// "CPU prefill attention"), so results never depend on how a prompt is cut into chunks or
// tiles. With AVX-512: query-tiled, GEMM-shaped loops over blocks of keys; otherwise
// AttendOne per query. `scratch` holds AttendTileScratchFloats(layout, max_keys) floats.
void AttendTile(const KvRowLayout& layout, const QueryTile& tile,
                absl::Span<const KeySegment> segments, float* scratch, float* out,
                int64_t out_stride, Isa isa = ActiveIsa());

}  // namespace dcf::cpu
