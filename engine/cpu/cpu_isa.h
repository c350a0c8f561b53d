// Which instruction-set level the CPU backend's hand-written kernels use, chosen once at run
// time (the binary is built for baseline x86-64 and runs everywhere).
//
//   kAvx512   AVX-512 F/BW/VL/DQ + FMA + F16C (Intel Skylake-SP and later, AMD Zen 4)
//   kAvx2     AVX2 + FMA + F16C (Intel Haswell and later, AMD Zen 1-3)
//   kPortable plain C++ (any CPU; the compiler vectorises what it can for baseline x86-64)
//
// The environment variable DCF_CPU_ISA=avx512|avx2|portable caps the level (for tests and
// benchmarks of the fallbacks); a level the CPU lacks is never used. Thread-safe.
#pragma once

#include <optional>
#include <string_view>

namespace dcf::cpu {

enum class Isa { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };

// The best level this CPU supports (ignores DCF_CPU_ISA).
Isa DetectedIsa();
// min(DetectedIsa(), DCF_CPU_ISA) computed at first use; what kernels use by default.
Isa ActiveIsa();
// Clamps a requested level to what the CPU supports.
Isa SupportedIsa(Isa requested);
// Whether the CPU has AVX-512 VNNI (vpdpbusd), which the AVX-512 int8 x int8 kernel needs
// beside kAvx512 (Intel Cascade Lake and later, AMD Zen 4); without it those products run
// the AVX2 or portable kernel.
bool HasAvx512Vnni();

const char* IsaName(Isa isa);  // "avx512", "avx2", "portable"
std::optional<Isa> ParseIsa(std::string_view name);

}  // namespace dcf::cpu
