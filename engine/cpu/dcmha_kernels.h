// The per-ISA implementations behind cpu::AttendOne (dcmha.h). Internal to engine/cpu.
#pragma once

#include <cstdint>

#include "engine/cpu/dcmha.h"

namespace dcf::cpu::kernels {

// AttendOne with AVX-512 (dcmha_avx512.cc); only call when ActiveIsa() is kAvx512 and
// AttendOneAvx512Supports(layout) (head_dim <= 128). Every segment's rows are of `dtype`.
bool AttendOneAvx512Supports(const KvRowLayout& layout);
void AttendOneAvx512(const KvRowLayout& layout, const QueryInputs& qi, const KeySegment* segments,
                     int num_segments, int64_t lo, int64_t hi, DType dtype, float* scratch,
                     float* out);

}  // namespace dcf::cpu::kernels
