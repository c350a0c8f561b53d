#include "engine/simt/fiber_stacks.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace dcf::simt::detail {
namespace {

thread_local const FiberStacks* active_pool = nullptr;
thread_local const char* active_what = nullptr;
struct sigaction previous_action;

void OnSegv(int signal, siginfo_t* info, void* context) {
  const FiberStacks* pool = active_pool;
  if (pool != nullptr && pool->IsGuardPage(info->si_addr)) {
    char text[256];
    const int n = std::snprintf(
        text, sizeof(text),
        "dcf simt: fiber stack overflow in kernel '%s': a thread used more than its %zu KiB "
        "of stack; raise DCF_SIMT_STACK_KB\n",
        active_what != nullptr ? active_what : "?", pool->stack_bytes() / 1024);
    if (n > 0) (void)!write(STDERR_FILENO, text, static_cast<size_t>(n));
    std::abort();
  }
  // Not ours: restore the previous disposition; the faulting access repeats and goes there.
  sigaction(SIGSEGV, &previous_action, nullptr);
}

// The handler runs on an alternate stack (the faulting one is exhausted): one per thread.
void InstallOverflowReporter() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action = {};
    action.sa_sigaction = &OnSegv;
    action.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    sigaction(SIGSEGV, &action, &previous_action);
  });
  thread_local bool has_alt_stack = false;
  if (has_alt_stack) return;
  has_alt_stack = true;
  stack_t current = {};
  if (sigaltstack(nullptr, &current) == 0 && (current.ss_flags & SS_DISABLE) == 0) return;
  stack_t alt = {};
  alt.ss_size = 64 * 1024;
  alt.ss_sp = std::malloc(alt.ss_size);  // lives as long as the thread
  if (alt.ss_sp != nullptr) sigaltstack(&alt, nullptr);
}

}  // namespace

void FiberStacks::SetActive(const FiberStacks* pool, const char* what) {
  if (pool != nullptr) InstallOverflowReporter();
  active_pool = pool;
  active_what = what;
}

bool FiberStacks::IsGuardPage(const void* address) const {
  const auto a = reinterpret_cast<uintptr_t>(address);
  const size_t slot = page_bytes_ + stack_bytes_;
  for (const Mapping& m : mappings_) {
    const auto base = reinterpret_cast<uintptr_t>(m.base);
    if (a >= base && a < base + m.bytes && (a - base) % slot < page_bytes_) return true;
  }
  return false;
}

FiberStacks::FiberStacks(size_t stack_bytes)
    : page_bytes_(static_cast<size_t>(sysconf(_SC_PAGESIZE))),
      stack_bytes_((stack_bytes + page_bytes_ - 1) / page_bytes_ * page_bytes_) {}

FiberStacks::~FiberStacks() {
  for (const Mapping& m : mappings_) {
#if defined(__SANITIZE_ADDRESS__)
    // ASan's shadow outlives munmap: a fiber's stack poisoning left there made a later
    // mapping at the same addresses (a malloc'd weight buffer) a "stack-buffer-underflow".
    __asan_unpoison_memory_region(m.base, m.bytes);
#endif
    munmap(m.base, m.bytes);
  }
}

void FiberStacks::Reserve(int count) {
  const int have = static_cast<int>(stacks_.size());
  if (count <= have) return;
  // Grow geometrically so that a block size creeping upwards maps few regions.
  const int add = count - have > have ? count - have : have;
  const size_t slot = page_bytes_ + stack_bytes_;  // guard page, then the stack above it
  const size_t bytes = slot * static_cast<size_t>(add);
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
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
