#include "engine/sampling/exp_shifted.h"

// GCC 12 warns about the deliberately undefined vectors inside its own AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <cmath>

namespace dcf {
namespace {

#define DCF_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,fma")))

DCF_AVX512 double ExpShiftedAvx512(const float* v, int64_t n, double shift, double* out) {
  const __m512d log2e = _mm512_set1_pd(1.4426950408889634074);
  const __m512d ln2_hi = _mm512_set1_pd(6.93147180369123816490e-01);  // 32 bits of ln 2
  const __m512d ln2_lo = _mm512_set1_pd(1.90821492927058770002e-10);
  const __m512d lowest = _mm512_set1_pd(-745.2);
  // 1/j! for j = 13 .. 2 (Horner from the top).
  static constexpr double kInvFact[] = {
      1.0 / 6227020800, 1.0 / 479001600, 1.0 / 39916800, 1.0 / 3628800,
      1.0 / 362880,     1.0 / 40320,     1.0 / 5040,     1.0 / 720,
      1.0 / 120,        1.0 / 24,        1.0 / 6,        1.0 / 2};
  const __m512d s = _mm512_set1_pd(shift);
  __m512d sum = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i < n; i += 8) {
    const __mmask8 m = n - i >= 8 ? 0xff : static_cast<__mmask8>((1u << (n - i)) - 1);
    const __m512d x = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, v + i)), s);
    const __mmask8 live = _mm512_mask_cmp_pd_mask(m, x, lowest, _CMP_GE_OQ);
    const __m512d xc = _mm512_max_pd(x, lowest);
    const __m512d k = _mm512_roundscale_pd(_mm512_mul_pd(xc, log2e),
                                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512d r = _mm512_fnmadd_pd(k, ln2_hi, xc);
    r = _mm512_fnmadd_pd(k, ln2_lo, r);
    __m512d p = _mm512_set1_pd(kInvFact[0]);
    for (int j = 1; j < 12; ++j) p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(kInvFact[j]));
    // 1 + r + r^2 (1/2 + r/6 + ...): the two leading terms added last for accuracy.
    p = _mm512_fmadd_pd(_mm512_mul_pd(p, r), r, r);
    p = _mm512_add_pd(p, _mm512_set1_pd(1.0));
    const __m512d e = _mm512_maskz_scalef_pd(live, p, k);
    _mm512_mask_storeu_pd(out + i, m, e);
    sum = _mm512_add_pd(sum, e);
  }
  return _mm512_reduce_add_pd(sum);
}

}  // namespace

double ExpShifted(const float* v, int64_t n, double shift, double* out) {
#if defined(__x86_64__)
  static const bool avx512 = __builtin_cpu_supports("avx512f") &&
                            __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  if (avx512) return ExpShiftedAvx512(v, n, shift, out);
#endif
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += out[i] = std::exp(static_cast<double>(v[i]) - shift);
  return sum;
}

}  // namespace dcf
