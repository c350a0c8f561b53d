// AVX-512 kernel of cpu::SiluMul (cpu_ops.h). Compiled for baseline x86-64 with the target
// attribute on the vector code, run only when cpu_isa.h found AVX-512.
// GCC 12 warns about the deliberately undefined vectors inside its own AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>

#include "engine/cpu/dcmha_avx512_inl.h"

namespace dcf::cpu::kernels {

// The scalar Silu(g) * u with exp from Exp (~1 ulp): g / (1 + exp(-g)), rounded, times u;
// the tail through masked loads and stores.
DCF_AVX512 void SiluMulAvx512(const float* g, const float* u, float* out, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = TailMask(n - i < 16 ? static_cast<int>(n - i) : 16);
    const __m512 x = _mm512_maskz_loadu_ps(m, g + i);
    const __m512 e = Exp(_mm512_xor_ps(x, _mm512_set1_ps(-0.0f)));  // exp(-x)
    const __m512 silu = _mm512_div_ps(x, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, u + i)));
  }
}

}  // namespace dcf::cpu::kernels
