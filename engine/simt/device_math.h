// The CUDA device math a kernel uses, for the SIMT emulator. The C functions (expf, logf,
// exp2f, log1pf, sqrtf, tanhf, erff, fmaxf, fminf, fabsf, floorf, ceilf, powf, fmaf, isnan,
// isinf, INFINITY, ...) come from <math.h> as on the host; this header adds the CUDA-only
// ones. The fast intrinsics (__expf, __logf, __fdividef, ...) are computed with the accurate
// host functions: results may differ from a GPU by a few ulps, so kernel tests compare with
// tolerances. Also here: bit casts (__float_as_int ...), bit counts (__popc, __clz, __ffs),
// min/max for equal argument types, __ldg and the memory fences.
#pragma once

#include <math.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "engine/simt/half_types.h"
#include "engine/simt/vector_types.h"

// glibc's <math.h> declares these names (C linkage, noexcept) without exporting them, so
// they are defined here with exactly that declaration.
extern "C" {
inline float __expf(float x) noexcept { return expf(x); }
inline float __logf(float x) noexcept { return logf(x); }
inline float __log2f(float x) noexcept { return log2f(x); }
inline float __powf(float x, float y) noexcept { return powf(x, y); }
inline float __sinf(float x) noexcept { return sinf(x); }
inline float __cosf(float x) noexcept { return cosf(x); }
}

namespace dcf::simt {

inline float __fdividef(float x, float y) { return x / y; }
// A product and a sum rounded on their own, never fused into a multiply-add with a
// neighbouring operation (CUDA's guarantee for these intrinsics): an opaque call keeps g++'s
// -ffp-contract=fast (DCFORMER_SIM_FMA) from contracting them after inlining.
[[gnu::noinline]] inline float __fmul_rn(float x, float y) { return x * y; }
[[gnu::noinline]] inline float __fadd_rn(float x, float y) { return x + y; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

inline int __float_as_int(float x) {
  int i;
  std::memcpy(&i, &x, sizeof(i));
  return i;
}
inline unsigned int __float_as_uint(float x) {
  unsigned int u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}
inline float __int_as_float(int i) {
  float x;
  std::memcpy(&x, &i, sizeof(x));
  return x;
}
inline float __uint_as_float(unsigned int u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

inline int __popc(unsigned int x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned int>(x)); }
inline int __clzll(long long x) {
  return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x));
}
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }

// min/max for two arguments of the same type. Mixed types (int with unsigned, float with
// double) are ambiguous here on purpose: CUDA resolves them with promotion rules that are
// easy to get wrong; cast one side.
#define DCF_SIMT_MIN_MAX(T)                        \
  inline T min(T a, T b) { return b < a ? b : a; } \
  inline T max(T a, T b) { return a < b ? b : a; }
DCF_SIMT_MIN_MAX(int)
DCF_SIMT_MIN_MAX(unsigned int)
DCF_SIMT_MIN_MAX(long)
DCF_SIMT_MIN_MAX(unsigned long)
DCF_SIMT_MIN_MAX(long long)
DCF_SIMT_MIN_MAX(unsigned long long)
#undef DCF_SIMT_MIN_MAX
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

namespace detail {
template <typename T>
inline constexpr bool kLdgType =
    std::is_arithmetic_v<T> || std::is_same_v<T, float2> || std::is_same_v<T, float4> ||
    std::is_same_v<T, int2> || std::is_same_v<T, int4> || std::is_same_v<T, uint2> ||
    std::is_same_v<T, uint4> || std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;
}  // namespace detail

// Read-only cached load: a plain load here. Accepts the types CUDA's overloads accept.
template <typename T>
inline T __ldg(const T* p) {
  static_assert(detail::kLdgType<std::remove_cv_t<T>>, "__ldg: type not supported by CUDA");
  return *p;
}

inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }

}  // namespace dcf::simt

using dcf::simt::__clz;
using dcf::simt::__clzll;
using dcf::simt::__fadd_rn;
using dcf::simt::__fdividef;
using dcf::simt::__fmul_rn;
using dcf::simt::__ffs;
using dcf::simt::__ffsll;
using dcf::simt::__float_as_int;
using dcf::simt::__float_as_uint;
using dcf::simt::__int_as_float;
using dcf::simt::__ldg;
using dcf::simt::__popc;
using dcf::simt::__popcll;
using dcf::simt::__saturatef;
using dcf::simt::__threadfence;
using dcf::simt::__threadfence_block;
using dcf::simt::__uint_as_float;
using dcf::simt::max;
using dcf::simt::min;
using dcf::simt::rsqrtf;
