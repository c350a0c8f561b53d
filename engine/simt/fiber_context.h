// A suspended execution context: the one primitive the fibers of the SIMT emulator are built
// on. On x86-64 the switch is hand-written (saves the callee-saved registers, MXCSR and the
// x87 control word, then swaps stack pointers: no system call); elsewhere, or with
// DCF_SIMT_CONTEXT=ucontext, it is POSIX swapcontext (which also saves the signal mask, with
// a system call per switch).
//
// Under AddressSanitizer and ThreadSanitizer every switch is announced to the sanitizer
// (ASan's __sanitizer_start_switch_fiber / __sanitizer_finish_switch_fiber, TSan's
// __tsan_create_fiber / __tsan_switch_to_fiber), so that they follow the fibers' stacks: ASan
// checks a kernel's stack frames and its fake stacks (detect_stack_use_after_return) per
// fiber, TSan keeps one shadow state per fiber. A stack given to Prepare is unpoisoned first
// (the previous fiber on it may have left redzones of frames that never returned).
//
// Not thread-safe. A context prepared on an OS thread is resumed only on that thread.
#pragma once

#include <cstddef>
#include <memory>

#include "engine/simt/config.h"

struct ucontext_t;

namespace dcf::simt::detail {

class FiberContext {
 public:
  FiberContext();
  ~FiberContext();
  FiberContext(FiberContext&&) noexcept;
  FiberContext& operator=(FiberContext&&) noexcept;

  // Makes this context start `entry(arg)` on the stack [stack, stack + size) when it is
  // first switched to. `entry` must never return: it ends by switching away for good.
  void Prepare(ContextKind kind, void* stack, size_t size, void (*entry)(void*), void* arg);

  // Saves the running context into `from` and resumes `to` (prepared or saved with the same
  // ContextKind). Returns when another context switches back to `from`. `from_ends`: `from`
  // is never resumed again (its fiber exited or was abandoned), so the sanitizers may free
  // what they hold for it.
  static void Switch(FiberContext& from, FiberContext& to, bool from_ends = false);

 private:
  static void Start(void* self);  // every prepared context begins here
  static void UcontextEntry(unsigned int high, unsigned int low);
  // Called on the resumed side of every switch (and at a fiber's start, fake_stack null).
  static void FinishSwitch(void* fake_stack);

  ContextKind kind_ = ContextKind::kAssembly;
  void* stack_pointer_ = nullptr;         // kAssembly: where the registers were pushed
  std::unique_ptr<ucontext_t> ucontext_;  // kUcontext
  void (*entry_)(void*) = nullptr;
  void* arg_ = nullptr;
  // For the sanitizers: the stack this context runs on (a prepared fiber's, or what ASan
  // reported for the thread's own stack when it was last switched away from), ASan's saved
  // fake stack, and TSan's fiber (owned when this context was prepared).
  const void* stack_bottom_ = nullptr;
  size_t stack_bytes_ = 0;
  void* asan_fake_stack_ = nullptr;
  void* tsan_fiber_ = nullptr;
  bool tsan_fiber_owned_ = false;
};

}  // namespace dcf::simt::detail
