// A team of threads that run one piece of work together (a CPU backend step, or one product
// outside a step): barriers that spin briefly before sleeping, and loops whose iterations the
// threads take one at a time.
//
// Why not OpenMP's own: a step of the CPU backend was one OpenMP parallel region per product
// (four to eight a layer), and under OMP_WAIT_POLICY=passive, which the server sets by default
// (engine/common/compute_threads.h), every region start and every barrier puts the waiting
// threads to sleep at once and wakes them through the kernel: a batch-1 decode step of the 261M
// model 10-16% slower than with spinning threads (OMP_WAIT_POLICY=active), int8 x int8 15-20%
// (bench/README.md, "One region a step"). A step now opens one region (one wake-up) whose
// threads meet at Team::Barrier, which spins for up to kSpinMicros (yielding the core after the
// first kPureSpinMicros, for processes that share it) and only then sleeps on a futex. So the
// threads spin only inside a step, between its parts, and sleep between steps as passive asks.
//
// Every thread of a team calls the same sequence of Barrier and ForEach (they count loops to
// share two loop counters). A Team of one thread needs no other and never waits.
#pragma once

#include <omp.h>

#include <atomic>
#include <cstdint>

namespace dcf::cpu {

// The state the threads of a team share. Reset() before a team starts on it.
struct TeamState {
  void Reset() {
    arrived.store(0, std::memory_order_relaxed);
    next[0].store(0, std::memory_order_relaxed);
    next[1].store(0, std::memory_order_relaxed);
  }
  alignas(64) std::atomic<uint32_t> arrived{0};
  alignas(64) std::atomic<uint32_t> generation{0};  // futex word: bumped by each barrier
  std::atomic<uint32_t> sleepers{0};                // threads asleep (or about to) on it
  alignas(64) std::atomic<int64_t> next[2] = {0, 0};  // loop counters, alternating
};

class Team {
 public:
  // Spin (with the CPU's pause) this long at a barrier, then yield the core between checks
  // until kSpinMicros, then sleep until the last thread arrives.
  static constexpr int kPureSpinMicros = 20;
  static constexpr int kSpinMicros = 200;

  Team(TeamState* state, int rank, int size) : state_(state), rank_(rank), size_(size) {}
  // A team of the calling thread alone (it shares nothing: no state).
  Team() : Team(nullptr, 0, 1) {}
  Team(const Team&) = delete;
  Team& operator=(const Team&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool leader() const { return rank_ == 0; }

  // Returns when every thread of the team has called it; what each wrote before is visible
  // to all after.
  void Barrier();

  // [*begin, *end): this thread's run of n things cut into size() consecutive runs.
  void Share(int64_t n, int64_t* begin, int64_t* end) const {
    *begin = n * rank_ / size_;
    *end = n * (rank_ + 1) / size_;
  }

  // fn(i) once for each i in [0, n), the iterations handed out one at a time to whichever
  // thread asks first, then Barrier(). Nothing may depend on which thread runs an iteration.
  template <typename Fn>
  void ForEach(int64_t n, Fn&& fn) {
    if (size_ <= 1) {
      for (int64_t i = 0; i < n; ++i) fn(i);
      return;
    }
    std::atomic<int64_t>& next = state_->next[loops_ & 1];
    ++loops_;
    for (int64_t i = next.fetch_add(1, std::memory_order_relaxed); i < n;
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      fn(i);
    }
    // The other counter was last used by the loop before this one, which every thread has
    // left (they all passed its barrier); the next loop starts after this barrier.
    if (leader()) state_->next[loops_ & 1].store(0, std::memory_order_relaxed);
    Barrier();
  }

 private:
  void Wait(uint32_t generation);

  TeamState* state_;
  int rank_;
  int size_;
  int64_t loops_ = 0;
};

// The calling thread's TeamState for the teams it starts (RunTeam).
TeamState* CallerTeamState();

// Runs fn(team) on a team of `threads` OpenMP threads (one parallel region; fewer threads
// when OpenMP gives fewer), the caller being the leader; on the caller alone when threads <= 1
// or when it is already inside a parallel region (e.g. the leader of a running team, whose
// state it must leave alone).
template <typename Fn>
void RunTeam(int threads, Fn&& fn) {
  if (threads <= 1 || omp_in_parallel()) {
    Team alone;
    fn(alone);
    return;
  }
  TeamState* state = CallerTeamState();
  state->Reset();
#pragma omp parallel num_threads(threads)
  {
    Team team(state, omp_get_thread_num(), omp_get_num_threads());
    fn(team);
  }
}

}  // namespace dcf::cpu
