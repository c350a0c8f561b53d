// The int8 weight-only quantization rule (docs/QUANTIZATION.md), in one place: the CPU
// backend's load-time quantization (cpu::PackedMatrix::QuantizeInt8) and the offline
// dcformer-quantize both call it, so a checkpoint quantized offline holds the bits that
// --weight-dtype int8 computes at load.
//
// Symmetric, per group of `group` consecutive input columns of one output row:
//   scale = bf16(max |w| / 127)  (round to nearest even; 0 for an all-zero group)
//   q     = clamp(round_half_even(w / scale), -127, 127)   (0 when scale is 0)
//   w ~= q * scale, exactly representable in fp32 (7 by 8 significant bits).
// Non-finite weights (refused by --check-weights) give q = 0 where w / scale is NaN.
// Pure functions, thread-safe.
#pragma once

#include <cstdint>

namespace dcf {

// Group sizes the kernels support (divisors of their column block).
inline bool ValidInt8GroupSize(int group) { return group == 32 || group == 64 || group == 128; }

// Groups of one row of `n` values: ceil(n / group) (the last one may be partial).
inline int64_t Int8Groups(int64_t n, int group) { return (n + group - 1) / group; }

// Quantizes one row: v[n] fp32 -> q[n] int8 and scales[Int8Groups(n, group)] bf16 bits.
void QuantizeRowInt8(const float* v, int64_t n, int group, int8_t* q, uint16_t* scales);

}  // namespace dcf
