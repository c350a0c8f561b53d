// Elementwise and row-wise fp32 kernels of the CPU backend (its matrix products are in
// packed_matrix.h). All operate on row-major arrays; shapes are given in the comments.
// Thread-safe (no shared state); callers parallelise.
#pragma once

#include <cstdint>

#include "engine/cpu/cpu_isa.h"

namespace dcf::cpu {

// Per row of x[T, E]: y = x / sqrt(mean(x^2) + eps) * w.
void RmsNorm(const float* x, const float* w, int64_t T, int64_t E, double eps, float* y);
// Per row of x[T, E]: y = (x - mean) / sqrt(var + eps) * w + b (biased variance).
void LayerNorm(const float* x, const float* w, const float* b, int64_t T, int64_t E, double eps,
               float* y);

// Exact GELU: 0.5 x (1 + erf(x / sqrt 2)).
float GeluErf(float x);
float Silu(float x);
// out[i] = Silu(g[i]) * u[i] for i < n (the FFN's SwiGLU). The portable and AVX2 levels run
// the scalar functions above; AVX-512 computes exp with the attention kernels' polynomial
// (dcmha_avx512_inl.h, ~1 ulp where std::exp is within half an ulp), 16 lanes at a time, so
// its results may differ from theirs in the last bits (up to 4 ulp: cpu_ops_test).
// Either way an element's result depends on nothing but g[i] and u[i].
void SiluMul(const float* g, const float* u, float* out, int64_t n, Isa isa);

// Half-pairing RoPE with the angles of RopeAngles (engine/execution/step_plan.h): rotates dims
// (j, j + r/2) of x[hd] for j < r/2 and leaves dims >= r untouched.
void ApplyRope(float* x, int rotary_dim, const float* cos_in, const float* sin_in);

}  // namespace dcf::cpu
