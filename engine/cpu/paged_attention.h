// One layer's attention over the paged KV cache for one step, on the CPU: the fresh cache
// rows of every sequence are written into its blocks (only the positions the layer keeps,
// step_batch.h's window rule), then every query attends to its visible keys
// (cpu::AttendTile / AttendOne; the chunk's own keys come from the fresh rows). The
// projections around it (q, k, v, the dynamic compose terms, Wo) are the caller's.
//
// Rows are of the KV cache dtype (F32, BF16 or F16), the fresh ones too: the caller rounds a
// chunk's fresh rows exactly as they are stored, so a query reads the same values whether a
// key came from this step's rows or from the cache, and results never depend on chunking,
// batching or a prefix-cache hit.
//
// A chunk of several new tokens attends in tiles of up to 32 queries (cpu::AttendTile: every
// key row read once per tile), a decode token alone (cpu::AttendOne); both give a query the
// same bits.
// The environment variable DCF_CPU_QUERY_TILES=0 makes every query attend alone (benchmarks
// of the per-query path in the same binary).
//
// Thread-safety: uses OpenMP threads over the tiles and queries; the caller owns every buffer
// and must not touch them concurrently.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/cpu/dcmha.h"
#include "engine/cpu/team.h"
#include "engine/kv/kv_layout.h"

namespace dcf::cpu {

// The new tokens of one sequence of the step and its block table for the layer's group.
struct PagedSequence {
  int start_pos = 0;          // cached positions before the step
  int num_tokens = 0;         // new tokens
  int64_t first_token = 0;    // index of its first new token in the step
  const int32_t* table = nullptr;  // [blocks_per_seq] physical block of each logical block
};

// Where a layer's rows live: row (block b, offset i) starts at element
// ((b * layers_in_group + layer_in_group) * block_size + i) * row_elems of `base`, each element
// of `dtype`.
struct PagedCacheView {
  void* base = nullptr;
  int layers_in_group = 1;
  int layer_in_group = 0;
  int block_size = 16;
  DType dtype = DType::kF32;
  void* Row(int32_t block, int offset, int row_elems) const {
    return static_cast<char*>(base) +
           ((static_cast<int64_t>(block) * layers_in_group + layer_in_group) * block_size +
            offset) *
               static_cast<int64_t>(row_elems) * DTypeSize(dtype);
  }
};

struct PagedAttentionInputs {
  KvRowLayout layout{0, 0};
  int window = 0;                             // 0: global layer
  bool compose = true;                        // false: plain multi-head attention
  bool query_tiles = true;                    // false: every query alone (AttendOne; the
                                              //   reference of tests and benchmarks)
  const PagedSequence* seqs = nullptr;        // [S]
  int num_seqs = 0;
  const int64_t* positions = nullptr;         // [T]
  const int32_t* seq_of = nullptr;            // [T] sequence of each token
  int64_t num_tokens = 0;                     // T
  const void* rows = nullptr;                 // [T, row] fresh K | V | key terms (kv_layout.h),
                                              //   of cache.dtype
  const float* q = nullptr;                   // [T, *] row stride q_stride, [N, hd] each
  int64_t q_stride = 0;
  const float* dw = nullptr;                  // [T, C, 2I, N] dynamic W1 | W2 per branch
  const float* g = nullptr;                   // [T, *] row stride g_stride, [C, N] each:
  int64_t g_stride = 0;                       //   dynamic G per branch
  PagedCacheView cache;
};

// Phase times in seconds, added to by PagedAttention (benchmarks).
struct PagedAttentionTimes {
  double cache_write = 0;
  double attention = 0;
};

// Writes the kept fresh rows into the cache and fills out [T, N*hd] f32.
void PagedAttention(const PagedAttentionInputs& in, float* out,
                    PagedAttentionTimes* times = nullptr);

// What the threads of a team share in one PagedAttention call: every sequence's keys and the
// work items (a query, or a tile of queries). Kept between calls, so its vectors keep their
// room.
struct PagedAttentionWork {
  struct Item {
    int seq;
    int64_t token;  // first token of the item
    int count;      // queries: 1 .. QueryTile::kMaxQueries
  };
  std::vector<std::vector<KeySegment>> segments;  // [S]
  std::vector<Item> items;
  int64_t scratch_floats = 0;  // each thread's
  // One query split between the threads (AttendOne(team, ...), a batch-1 decode step): their
  // common scratch, grown when too small.
  std::vector<float> shared_scratch;
};

// The same on the threads of `team` (team.h), every one of which calls it with the same
// arguments: the leader writes the rows and plans the items into `work`, the threads take
// the items (the same bits whichever runs which); a step of one query splits it between them
// (cpu::AttendOne(team, ...)). Returns on every thread after a barrier.
// `times` is written by the leader.
void PagedAttention(Team& team, const PagedAttentionInputs& in, PagedAttentionWork* work,
                    float* out, PagedAttentionTimes* times = nullptr);

// Bytes of scratch PagedAttention(in) allocates, all threads together (the memory figure of
// benchmarks).
int64_t PagedAttentionScratchBytes(const PagedAttentionInputs& in);

}  // namespace dcf::cpu
