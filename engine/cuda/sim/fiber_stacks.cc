#include "engine/cuda/sim/fiber_stacks.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace dcf::simt::detail {

FiberStacks::FiberStacks(size_t stack_bytes)
    : page_bytes_(static_cast<size_t>(sysconf(_SC_PAGESIZE))),
      stack_bytes_((stack_bytes + page_bytes_ - 1) / page_bytes_ * page_bytes_) {}

FiberStacks::~FiberStacks() {
  for (const Mapping& m : mappings_) munmap(m.base, m.bytes);
}

void FiberStacks::Reserve(int count) {
  const int have = static_cast<int>(stacks_.size());
  if (count <= have) return;
  // Grow geometrically so that a block size creeping upwards maps few regions.
  const int add = count - have > have ? count - have : have;
  const size_t slot = page_bytes_ + stack_bytes_;  // guard page, then the stack above it
  const size_t bytes = slot * static_cast<size_t>(add);
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS |
                    MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    std::perror("dcf simt: mmap of fiber stacks");
    std::abort();
  }
  mappings_.push_back(Mapping{base, bytes});
  for (int i = 0; i < add; ++i) {
    char* guard = static_cast<char*>(base) + slot * static_cast<size_t>(i);
    if (mprotect(guard, page_bytes_, PROT_NONE) != 0) {
      std::perror("dcf simt: mprotect of a stack guard page");
      std::abort();
    }
    stacks_.push_back(guard + page_bytes_);
  }
}

}  // namespace dcf::simt::detail
