#include "engine/cpu/team.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <climits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace dcf::cpu {
namespace {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "the generation is a futex word");

uint32_t* Word(std::atomic<uint32_t>* a) { return reinterpret_cast<uint32_t*>(a); }

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected) {
  // Returns at once (EAGAIN) when the word no longer holds `expected`; spurious wake-ups and
  // EINTR are handled by the caller's loop.
  syscall(SYS_futex, Word(word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, Word(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

}  // namespace

TeamState* CallerTeamState() {
  thread_local TeamState state;
  return &state;
}

void Team::Barrier() {
  if (size_ <= 1) return;
  TeamState& s = *state_;
  // The generation cannot move on before this thread arrives.
  const uint32_t generation = s.generation.load(std::memory_order_acquire);
  if (s.arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(size_)) {
    s.arrived.store(0, std::memory_order_relaxed);
    // seq_cst store then load, against the sleeper's increment then load (Wait): either this
    // thread sees the sleeper, or the sleeper sees the new generation.
    s.generation.store(generation + 1, std::memory_order_seq_cst);
    if (s.sleepers.load(std::memory_order_seq_cst) > 0) FutexWakeAll(&s.generation);
    return;
  }
  Wait(generation);
}

void Team::Wait(uint32_t generation) {
  TeamState& s = *state_;
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  for (int i = 1;; ++i) {
    if (s.generation.load(std::memory_order_acquire) != generation) return;
    if (i % 32 != 0) {
      CpuRelax();
      continue;
    }
    const auto waited = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start);
    if (waited.count() >= kSpinMicros) break;
    if (waited.count() >= kPureSpinMicros) sched_yield();  // a co-located thread may need it
  }
  s.sleepers.fetch_add(1, std::memory_order_seq_cst);
  while (s.generation.load(std::memory_order_seq_cst) == generation) {
    FutexWait(&s.generation, generation);
  }
  s.sleepers.fetch_sub(1, std::memory_order_release);
}

}  // namespace dcf::cpu
