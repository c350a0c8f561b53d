// Shared-memory racecheck for the SIMT emulator (DCF_SIMT_RACECHECK=1, the default): like
// compute-sanitizer's racecheck, it reports two accesses to the same shared-memory byte by
// different threads of a block, at least one of them a write, with no __syncthreads between
// them (and, for two lanes of one warp, no warp collective -- __syncwarp, a shuffle, a vote
// -- either). The report is a violation (block_runner.h): the block stops and the launch
// fails with the message, so a racy kernel fails its tests under every schedule.
//
// How: a thread's fiber runs without interruption from one synchronisation point to the next
// (a segment). Every access through a shared-array view (shared_memory.h) records the
// element and its bytes before the access; when the segment ends (the thread reaches a
// barrier, a warp collective or its end) each recorded element is classified -- written if
// its bytes changed, read otherwise -- and checked against the last writer and readers of
// the same barrier interval. Atomics (atomicAdd(&smem[i], v) ...) are exempt, as on a GPU.
// Limits: a write of the value already there counts as a read (a "benign" write-write race
// of equal values is not reported); a collective whose mask names only some lanes orders the
// whole warp; shared memory reached through a raw pointer is not seen (kernels never do
// that: cuda_compat.h).
//
// Not thread-safe: one per block runner (one OS thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dcf::simt::detail {

// Set while a block runs with racecheck on (read by the inline hooks below).
extern thread_local constinit bool racecheck_active;

// Hooks: an access to `bytes` bytes at `p` through the view of array `name`, element
// `index`; an atomic on `p` (global or shared).
void RaceTouch(const void* p, size_t bytes, const char* name, long long index);
void RaceAtomic(const void* p);

class RaceCheck {
 public:
  // Starts a block whose shared memory is [base, base + bytes).
  void BeginBlock(const unsigned char* base, size_t bytes, int warps);
  void Touch(const void* p, size_t bytes, const char* name, long long index);
  void Atomic(const void* p);

  struct Hazard {
    const char* kind;   // "Write-after-Write", "Write-after-Read", "Read-after-Write"
    const char* name;   // the array
    long long index;    // the element
    int other_thread;   // the thread of the earlier access
    bool other_wrote;
  };
  // Ends the running segment of `thread` (of warp `warp`); false with *hazard on a race.
  bool EndSegment(int thread, int warp, Hazard* hazard);
  // A __syncthreads released the block / a collective released warp `warp`.
  void BarrierReleased() { ++block_epoch_; }
  void WarpReleased(int warp) { ++warp_epoch_[warp]; }

 private:
  struct Cell {
    uint32_t w_epoch = 0, r_epoch = 0;          // block epochs of the last write / reads
    uint32_t w_warp_epoch = 0, r_warp_epoch = 0;  // the accessing warp's epoch then
    uint32_t seen = 0;                          // the segment that last recorded this byte
    int16_t writer = -1, reader = -1;
    bool readers = false;  // more than one thread read in r_epoch
  };
  struct Access {
    uint32_t offset, bytes, snapshot;  // snapshot: offset into snapshots_
    const char* name;
    long long index;
    bool atomic;
  };
  bool Conflicts(int other, uint32_t other_warp_epoch, int thread, int warp) const;

  const unsigned char* base_ = nullptr;
  size_t bytes_ = 0;
  std::vector<Cell> cells_;
  std::vector<uint32_t> warp_epoch_;
  std::vector<Access> accesses_;  // of the running segment
  std::vector<unsigned char> snapshots_;
  uint32_t block_epoch_ = 0;
  uint32_t segment_ = 0;
};

}  // namespace dcf::simt::detail
