// Counter-based random numbers for sampling: Philox4x32-10 (Salmon et al., "Parallel random
// numbers: as easy as 1, 2, 3", SC 2011). A request's n-th sampled token draws
// Uniform(seed, n): a pure function of its seed and step, so the draw does not depend on the
// batch, the backend, preemption or which thread samples, and host and device draw the same
// number. Header-only and usable from CUDA device code (DCF_HOST_DEVICE).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DCF_HOST_DEVICE __host__ __device__
#else
#define DCF_HOST_DEVICE
#endif

namespace dcf::philox {

struct Uint4 {
  uint32_t x, y, z, w;
};

DCF_HOST_DEVICE inline void MulHiLo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  *lo = static_cast<uint32_t>(p);
}

// Philox4x32 with 10 rounds: counter `c`, key (k0, k1).
DCF_HOST_DEVICE inline Uint4 Philox4x32(Uint4 c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    MulHiLo(kM0, c.x, &hi0, &lo0);
    MulHiLo(kM1, c.z, &hi1, &lo1);
    c = Uint4{hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
    k0 += kW0;
    k1 += kW1;
  }
  return c;
}

// A uniform double in [0, 1) with 53 random bits for draw number `step` of stream `seed`.
DCF_HOST_DEVICE inline double Uniform(uint64_t seed, uint64_t step) {
  const Uint4 r = Philox4x32(Uint4{static_cast<uint32_t>(step), static_cast<uint32_t>(step >> 32),
                                   0u, 0u},
                             static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  const uint64_t bits = (static_cast<uint64_t>(r.x) << 32 | r.y) >> 11;
  return static_cast<double>(bits) * (1.0 / 9007199254740992.0);  // 2^-53
}

}  // namespace dcf::philox
