// The per-ISA implementations behind cpu::AttendOne (dcmha.h). Internal to engine/cpu.
#pragma once

#include <cstdint>

#include "engine/cpu/dcmha.h"
#include "engine/cpu/team.h"

namespace dcf::cpu::kernels {

// AttendOne with AVX-512 (dcmha_avx512.cc); only call when ActiveIsa() is kAvx512 and
// AttendOneAvx512Supports(layout) (head_dim <= 128). Every segment's rows are of `dtype`.
// Split between the threads of `team` as AttendOne(team, ...) says (a team of one: alone).
bool AttendOneAvx512Supports(const KvRowLayout& layout);
void AttendOneAvx512(const KvRowLayout& layout, const QueryInputs& qi, const KeySegment* segments,
                     int num_segments, int64_t lo, int64_t hi, DType dtype, float* scratch,
                     float* out, Team& team);


// AttendTile with AVX-512 (attention_tile_avx512.cc); same preconditions as AttendOneAvx512.
int64_t AttendTileAvx512ScratchFloats(const KvRowLayout& layout, int64_t max_keys);
void AttendTileAvx512(const KvRowLayout& layout, const QueryTile& tile,
                      const KeySegment* segments, int num_segments, DType dtype, float* scratch,
                      float* out, int64_t out_stride);

}  // namespace dcf::cpu::kernels
