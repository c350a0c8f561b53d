// Stacks for the SIMT emulator's fibers: mmap'ed, each with a PROT_NONE guard page below it
// so that an overflow faults at once instead of corrupting the neighbouring stack. Pages are
// committed by the kernel only when touched, so reserving 1024 stacks of 64 KiB costs address
// space, not memory. Stacks are kept for the life of the pool and reused by every block.
//
// An overflow into a guard page of the pool that is active on the faulting thread is reported
// ("fiber stack overflow in kernel '...'; raise DCF_SIMT_STACK_KB") before the process aborts;
// other SIGSEGVs go to the previous handler.
//
// Not thread-safe: each block runner (one per OS thread) owns one pool.
#pragma once

#include <cstddef>
#include <vector>

namespace dcf::simt::detail {

class FiberStacks {
 public:
  // `stack_bytes` is rounded up to whole pages.
  explicit FiberStacks(size_t stack_bytes);
  ~FiberStacks();
  FiberStacks(const FiberStacks&) = delete;
  FiberStacks& operator=(const FiberStacks&) = delete;

  // Makes stacks 0..count-1 available; existing stacks keep their addresses.
  void Reserve(int count);
  void* stack(int i) const { return stacks_[i]; }  // lowest usable address
  size_t stack_bytes() const { return stack_bytes_; }

  // True when `address` lies in one of this pool's guard pages.
  bool IsGuardPage(const void* address) const;

  // Makes this pool the calling thread's active one while fibers run on it, naming what runs
  // (`what`, e.g. the kernel name) for the overflow report; nullptr pool to deactivate.
  static void SetActive(const FiberStacks* pool, const char* what);

 private:
  struct Mapping {
    void* base;
    size_t bytes;
  };
  size_t page_bytes_;
  size_t stack_bytes_;
  std::vector<Mapping> mappings_;
  std::vector<void*> stacks_;
};

}  // namespace dcf::simt::detail
