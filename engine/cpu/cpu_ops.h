// Elementwise and row-wise fp32 kernels of the CPU backend (its matrix products are in
// packed_matrix.h). All operate on row-major arrays; shapes are given in the comments.
// Thread-safe (no shared state); callers parallelise.
#pragma once

#include <cstdint>

namespace dcf::cpu {

// Per row of x[T, E]: y = x / sqrt(mean(x^2) + eps) * w.
void RmsNorm(const float* x, const float* w, int64_t T, int64_t E, double eps, float* y);
// Per row of x[T, E]: y = (x - mean) / sqrt(var + eps) * w + b (biased variance).
void LayerNorm(const float* x, const float* w, const float* b, int64_t T, int64_t E, double eps,
               float* y);

// Exact GELU: 0.5 x (1 + erf(x / sqrt 2)).
float GeluErf(float x);
float Silu(float x);

// Half-pairing RoPE with the angles of RopeAngles (engine/execution/step_plan.h): rotates dims
// (j, j + r/2) of x[hd] for j < r/2 and leaves dims >= r untouched.
void ApplyRope(float* x, int rotary_dim, const float* cos_in, const float* sin_in);

}  // namespace dcf::cpu
