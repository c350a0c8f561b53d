#include "engine/cpu/cpu_ops.h"

#include <cmath>

namespace dcf::cpu {

void RmsNorm(const float* x, const float* w, int64_t T, int64_t E, double eps, float* y) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * E;
    double ss = 0;
    for (int64_t e = 0; e < E; ++e) ss += static_cast<double>(xr[e]) * xr[e];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / E + eps));
    float* yr = y + t * E;
    for (int64_t e = 0; e < E; ++e) yr[e] = xr[e] * inv * w[e];
  }
}

void LayerNorm(const float* x, const float* w, const float* b, int64_t T, int64_t E, double eps,
               float* y) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xr = x + t * E;
    double sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += xr[e];
    const double mean = sum / E;
    double var = 0;
    for (int64_t e = 0; e < E; ++e) var += (xr[e] - mean) * (xr[e] - mean);
    const double inv = 1.0 / std::sqrt(var / E + eps);
    float* yr = y + t * E;
    for (int64_t e = 0; e < E; ++e) {
      yr[e] = static_cast<float>((xr[e] - mean) * inv) * w[e] + (b ? b[e] : 0.0f);
    }
  }
}

float GeluErf(float x) { return 0.5f * x * (1.0f + std::erf(x * static_cast<float>(M_SQRT1_2))); }

float Silu(float x) { return x / (1.0f + std::exp(-x)); }

namespace kernels {
void SiluMulAvx512(const float* g, const float* u, float* out, int64_t n);
}  // namespace kernels

void SiluMul(const float* g, const float* u, float* out, int64_t n, Isa isa) {
  if (SupportedIsa(isa) == Isa::kAvx512) {
    kernels::SiluMulAvx512(g, u, out, n);
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = Silu(g[i]) * u[i];
}

void ApplyRope(float* x, int rotary_dim, const float* cos_in, const float* sin_in) {
  const int half = rotary_dim / 2;
  for (int j = 0; j < half; ++j) {
    const float a = x[j], b = x[j + half];
    x[j] = a * cos_in[j] - b * sin_in[j];
    x[j + half] = b * cos_in[j] + a * sin_in[j];
  }
}

}  // namespace dcf::cpu
