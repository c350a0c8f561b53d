// A suspended execution context: the one primitive the fibers of the SIMT emulator are built
// on. On x86-64 the switch is hand-written (saves the callee-saved registers, MXCSR and the
// x87 control word, then swaps stack pointers: no system call); elsewhere, or with
// DCF_SIMT_CONTEXT=ucontext, it is POSIX swapcontext (which also saves the signal mask, with
// a system call per switch).
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
  // ContextKind). Returns when another context switches back to `from`.
  static void Switch(FiberContext& from, FiberContext& to);

 private:
  static void UcontextEntry(unsigned int high, unsigned int low);

  ContextKind kind_ = ContextKind::kAssembly;
  void* stack_pointer_ = nullptr;         // kAssembly: where the registers were pushed
  std::unique_ptr<ucontext_t> ucontext_;  // kUcontext
  void (*entry_)(void*) = nullptr;
  void* arg_ = nullptr;
};

}  // namespace dcf::simt::detail
