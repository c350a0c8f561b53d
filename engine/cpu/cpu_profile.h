// Where the CPU backend's step time goes: wall time per phase, accumulated over steps (for
// benchmarks; two clock reads per phase and layer cost a few microseconds per step).
// Not thread-safe: written by the backend's owner thread, read between steps.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>

namespace dcf::cpu {

struct CpuStepProfile {
  enum Phase {
    kEmbed,        // embedding rows, RoPE angles
    kNorm,         // attention / ffn / final norms
    kInProj,       // a [wqkv; dw1; dd]^T: q, k, v and the dynamic-weight projections
    kPerToken,     // per token: gelu, qkw products, tanh, W1 norm, qk-norm, RoPE, cache row
    kCacheWrite,   // rows copied into the paged cache, key segments
    kAttention,    // scores, pre-compose, softmax, post-compose, values
    kOutProj,      // o wo^T
    kFfnMatMul,    // w1, w3, w2
    kFfnAct,       // silu * gate or gelu
    kResidual,     // residual adds
    kLogits,       // final rows, output head
    kSample,       // token sampler and logprobs
    kNumPhases
  };
  std::array<double, kNumPhases> seconds{};
  int64_t steps = 0;
  int64_t tokens = 0;

  static const char* Name(int phase) {
    static constexpr const char* kNames[kNumPhases] = {
        "embed",    "norm",     "in_proj",  "dyn_w+qk_rope", "cache_write", "attention",
        "out_proj", "ffn_gemm", "ffn_act",  "residual",      "logits",      "sample"};
    return kNames[phase];
  }
  double Total() const {
    double t = 0;
    for (double s : seconds) t += s;
    return t;
  }
};

// Adds the time since construction (or the last Next) to one phase of a profile; with no
// profile (the threads of a step's team other than its leader), nothing.
class PhaseTimer {
 public:
  explicit PhaseTimer(CpuStepProfile* p)
      : p_(p), t_(p != nullptr ? std::chrono::steady_clock::now()
                               : std::chrono::steady_clock::time_point()) {}
  // Timing from `start` (an earlier clock reading) instead of now.
  PhaseTimer(CpuStepProfile* p, std::chrono::steady_clock::time_point start)
      : p_(p), t_(start) {}
  // Charges the elapsed time to `phase` and restarts the clock.
  void Next(CpuStepProfile::Phase phase) {
    if (p_ == nullptr) return;
    const auto now = std::chrono::steady_clock::now();
    p_->seconds[phase] += std::chrono::duration<double>(now - t_).count();
    t_ = now;
  }

 private:
  CpuStepProfile* p_;
  std::chrono::steady_clock::time_point t_;
};

}  // namespace dcf::cpu
