#include "engine/cpu/cpu_isa.h"

#include <algorithm>
#include <cstdlib>

#include "engine/common/logging.h"

namespace dcf::cpu {

Isa DetectedIsa() {
#if defined(__x86_64__)
  static const Isa isa = [] {
    __builtin_cpu_init();
    const bool fma_f16c = __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    if (fma_f16c && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
      return Isa::kAvx512;
    }
    if (fma_f16c && __builtin_cpu_supports("avx2")) return Isa::kAvx2;
    return Isa::kPortable;
  }();
  return isa;
#else
  return Isa::kPortable;
#endif
}

bool HasAvx512Vnni() {
#if defined(__x86_64__)
  static const bool vnni = [] {
    __builtin_cpu_init();
    return DetectedIsa() == Isa::kAvx512 && __builtin_cpu_supports("avx512vnni");
  }();
  return vnni;
#else
  return false;
#endif
}

Isa SupportedIsa(Isa requested) { return std::min(requested, DetectedIsa()); }

Isa ActiveIsa() {
  static const Isa isa = [] {
    const char* env = std::getenv("DCF_CPU_ISA");
    if (env == nullptr || *env == '\0') return DetectedIsa();
    const std::optional<Isa> want = ParseIsa(env);
    if (!want.has_value()) {
      DCF_LOG(Warning) << "DCF_CPU_ISA=" << env
                       << " is not one of avx512, avx2, portable; using " << IsaName(DetectedIsa());
      return DetectedIsa();
    }
    return SupportedIsa(*want);
  }();
  return isa;
}

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kAvx512: return "avx512";
    case Isa::kAvx2: return "avx2";
    case Isa::kPortable: return "portable";
  }
  return "?";
}

std::optional<Isa> ParseIsa(std::string_view name) {
  if (name == "avx512") return Isa::kAvx512;
  if (name == "avx2") return Isa::kAvx2;
  if (name == "portable") return Isa::kPortable;
  return std::nullopt;
}

}  // namespace dcf::cpu
