// Runs one thread block of a kernel in the SIMT emulator: every thread of the block is a
// fiber on the calling OS thread, and fibers switch only where CUDA threads synchronise
// (__syncthreads, warp collectives) or exit. The schedule (schedule.h) is deterministic:
// threads start in its order (linear by default), each runs until it blocks, and released
// threads resume in its order.
//
// The runner enforces the programming model and stops the block at the first violation
// (the faulting fiber never resumes; neither does any other fiber of the block):
// - __syncthreads reached by only part of the block (a thread exited) or at different call
//   sites;
// - a warp collective whose mask omits the calling lane, names lanes that do not exist (a
//   partial last warp), names lanes that exited or wait at __syncthreads, or never completes
//   because named lanes wait at a different collective; a shuffle that reads a lane outside
//   the mask; a shuffle width that is not a power of two in [1, 32];
// - a shared-memory index out of bounds, or more shared memory than the kernel may use.
// A violation is reported through ReportViolation (error_state.h) with the kernel name, block
// and thread index, call site and the offending value.
//
// Not thread-safe: one runner per OS thread (ForThisThread), used by one launch at a time.
#pragma once

#include <cstdint>
#include <source_location>
#include <string>
#include <vector>

#include "engine/simt/builtins.h"
#include "engine/simt/fiber_context.h"
#include "engine/simt/fiber_stacks.h"
#include "engine/simt/launch.h"
#include "engine/simt/racecheck.h"
#include "engine/simt/schedule.h"
#include "engine/simt/shared_arena.h"
#include "engine/simt/shared_memory.h"
#include "engine/simt/warp_collective.h"

namespace dcf::simt::detail {

class BlockRunner {
 public:
  BlockRunner();
  ~BlockRunner();
  BlockRunner(const BlockRunner&) = delete;
  BlockRunner& operator=(const BlockRunner&) = delete;

  // The calling OS thread's runner, created on first use.
  static BlockRunner& ForThisThread();
  // The runner executing a block on this OS thread, or nullptr outside a kernel.
  static BlockRunner* Active();

  // Runs block `block_idx` of `request` to completion. `shared_limit_bytes` bounds static
  // plus dynamic shared memory. Returns false when a violation stopped the block (already
  // reported).
  // `schedule_seed` feeds the random schedule's choices for this block.
  bool Run(const LaunchRequest& request, size_t shared_limit_bytes, uint3 block_idx,
           uint64_t schedule_seed);

  RaceCheck& race_check() { return race_; }

  // Entry points for the running kernel (through the front-ends in warp_ops.h and
  // shared_memory.h).
  void SyncThreads(const std::source_location& where);
  uint64_t WarpCollective(WarpOp op, unsigned int mask, uint64_t value, int arg, int width,
                          const std::source_location& where);
  void* StaticShared(const void* key, size_t bytes, size_t align, const char* name);
  DynamicSharedSpan DynamicShared();
  // Reports a violation by the running thread and abandons the block. Never returns.
  [[noreturn]] void Fault(const std::string& what);

 private:
  enum class State : uint8_t { kReady, kRunning, kAtBarrier, kAtWarpOp, kExited };
  struct Thread {
    uint3 thread_idx;  // what threadIdx reads while this fiber runs
    int id = 0;        // linear id in the block: x fastest
    State state = State::kReady;
    std::source_location where;  // the barrier or collective it waits at
    LaneRequest request{};       // while at a collective
    uint64_t result = 0;         // the collective's result for this lane
    FiberContext context;
  };

  static void FiberMain(void* thread);
  [[noreturn]] void Exit(Thread& self);
  // Leaves `self` (already marked waiting or exited) for the next ready fiber, or for the
  // scheduler when none is ready. Returns when `self` is resumed.
  // `self_ends` / `from_ends`: the fiber switched away from never resumes (it exited).
  void SwitchAway(Thread& self, bool self_ends = false);
  void Enter(FiberContext& from, Thread& next, bool from_ends = false);
  // The last thread to reach a barrier or collective, having made every participant (itself
  // included) ready: runs the first ready thread, returning when `self` is resumed.
  void YieldReleased(Thread& self);
  void PushReady(int id);
  // Makes ready, in the schedule's order, the threads in ids (given in linear order).
  void Release(std::vector<int>& ids);
  int PopReady();  // -1 when empty
  // A lane of `t`'s warp that waits at a collective whose mask names `t`, or nullptr.
  const Thread* WarpWaiterFor(const Thread& t) const;
  void DiagnoseDeadlock();
  std::string Describe(const Thread& t) const;  // "thread (x,y,z)"
  std::string Prefix(const Thread& t) const;    // "kernel 'k' block (x,y,z) thread (x,y,z): "

  FiberStacks stacks_;
  SharedArena shared_;
  FiberContext scheduler_;
  std::vector<Thread> threads_;  // [block size], capacity kept across blocks
  int num_threads_ = 0;
  std::vector<int> ready_;  // ring buffer of ready thread ids, capacity num_threads_
  int ready_head_ = 0;
  int ready_count_ = 0;
  std::vector<int> warp_waiting_;  // [num warps] lanes at a collective
  std::vector<int> warp_blocked_;  // [num warps] lanes exited or at __syncthreads
  Thread* current_ = nullptr;      // the running fiber; nullptr in the scheduler
  const LaunchRequest* request_ = nullptr;
  BlockCoords coords_{};
  int exited_ = 0;
  int first_exited_ = -1;
  int at_barrier_ = 0;
  int barrier_first_ = -1;  // the first thread waiting at the current barrier
  std::source_location barrier_site_;
  bool barrier_released_ = false;  // a __syncthreads completed in this block
  std::source_location last_barrier_site_;  // the last one that did
  bool faulted_ = false;
  // Ends the running segment of `self` for the racecheck; a hazard is a violation.
  void EndSegment(Thread& self);

  RaceCheck race_;
  bool racecheck_ = false;
  Schedule schedule_;
  ScheduleRng rng_{0};
  std::vector<int> release_;  // scratch of Release
};

}  // namespace dcf::simt::detail
