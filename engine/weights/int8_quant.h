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

// How a backend stores its matrices as int8 (--weight-dtype, --activation-dtype): `group` > 0
// quantizes them by QuantizeRowInt8 in groups of that many columns (ValidInt8GroupSize), 0
// keeps their dtype; `activations` (with a group only) makes their products int8 x int8, x
// quantized per row by QuantizeActivationRowInt8.
struct Int8Matrices {
  int group = 0;
  bool activations = false;

  bool enabled() const { return group > 0; }
};

// Groups of one row of `n` values: ceil(n / group) (the last one may be partial).
inline int64_t Int8Groups(int64_t n, int group) { return (n + group - 1) / group; }

// Quantizes one row: v[n] fp32 -> q[n] int8 and scales[Int8Groups(n, group)] bf16 bits.
void QuantizeRowInt8(const float* v, int64_t n, int group, int8_t* q, uint16_t* scales);

// The activation rule of int8 x int8 products (--activation-dtype int8; docs/QUANTIZATION.md),
// applied to each row of x a product reads, per group of `group` columns (the weights'
// groups), with fp32 scales:
//   scale = max |x| / 127 (fp32 division; 0 for an all-zero group)
//   q     = clamp(round_half_even(x * (127 / max |x|)), -127, 127)  (0 when max |x| is 0,
//           and where the product is NaN, e.g. an infinite x; (x / max |x|) * 127 when
//           max |x| is so small, below about 3.7e-37, that 127 / max |x| overflows)
//   A group holding a NaN gets a NaN scale (so the products it reaches are NaN, as in fp32);
//   one holding an infinity gets an infinite one (inf * 0 is NaN there too).
// Written as q + 128 (so u[k] in [1, 255], the unsigned operand of VNNI's u8 x s8
// multiply-add) to u[RoundUpTo4(n)], padded with 128 (q = 0), and scales[Int8Groups(n, group)].
inline int64_t RoundUpTo4(int64_t n) { return (n + 3) / 4 * 4; }
void QuantizeActivationRowInt8(const float* x, int64_t n, int group, uint8_t* u, float* scales);

}  // namespace dcf
