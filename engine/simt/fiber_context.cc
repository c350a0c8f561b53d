#include "engine/simt/fiber_context.h"

#include <ucontext.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

// dcf_simt_switch(void** save_sp, void* load_sp): pushes the callee-saved registers of the
// System V x86-64 ABI, stores the stack pointer in *save_sp, loads load_sp and pops the same
// frame from there. MXCSR and the x87 control word are not switched: all fibers of a block run
// on one OS thread and share its floating-point environment (kernels have no way to change
// rounding modes), and ldmxcsr/fldcw cost more than the rest of the switch (9 ns without them,
// 14-28 ns with them, on the 2-core CI-like machine). A fresh context's frame is
// built by Prepare() so that the final `ret` enters dcf_simt_fiber_start with the entry in
// r12 and its argument in r13. The start routine marks the end of the call stack for
// debuggers (undefined return address) and traps if the entry ever returns.
#if defined(__x86_64__)
extern "C" void dcf_simt_switch(void** save_sp, void* load_sp);
extern "C" void dcf_simt_fiber_start();
asm(R"(
  .text
  .p2align 4
  .globl dcf_simt_switch
  .hidden dcf_simt_switch
  .type dcf_simt_switch, @function
dcf_simt_switch:
  .cfi_startproc
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .cfi_endproc
  .size dcf_simt_switch, .-dcf_simt_switch

  .p2align 4
  .globl dcf_simt_fiber_start
  .hidden dcf_simt_fiber_start
  .type dcf_simt_fiber_start, @function
dcf_simt_fiber_start:
  .cfi_startproc
  .cfi_undefined rip
  movq %r13, %rdi
  callq *%r12
  ud2
  .cfi_endproc
  .size dcf_simt_fiber_start, .-dcf_simt_fiber_start
)");
#endif

namespace dcf::simt::detail {

FiberContext::FiberContext() = default;
FiberContext::~FiberContext() = default;
FiberContext::FiberContext(FiberContext&&) noexcept = default;
FiberContext& FiberContext::operator=(FiberContext&&) noexcept = default;

void FiberContext::Prepare(ContextKind kind, void* stack, size_t size, void (*entry)(void*),
                           void* arg) {
  kind_ = kind;
  entry_ = entry;
  arg_ = arg;
  if (kind == ContextKind::kAssembly) {
#if defined(__x86_64__)
    // Frame popped by dcf_simt_switch, lowest address first: r15, r14, r13, r12, rbx, rbp,
    // return address. After the `ret` the stack pointer must be 16-byte aligned
    // (dcf_simt_fiber_start calls the entry), so the return address sits at top - 24.
    auto top = (reinterpret_cast<uintptr_t>(stack) + size) & ~uintptr_t{15};
    auto* frame = reinterpret_cast<uint64_t*>(top - 24 - 6 * 8);
    frame[0] = 0;                                  // r15
    frame[1] = 0;                                  // r14
    frame[2] = reinterpret_cast<uint64_t>(arg);    // r13
    frame[3] = reinterpret_cast<uint64_t>(entry);  // r12
    frame[4] = 0;                                  // rbx
    frame[5] = 0;                                  // rbp
    frame[6] = reinterpret_cast<uint64_t>(&dcf_simt_fiber_start);
    stack_pointer_ = frame;
    return;
#else
    std::fprintf(stderr, "dcf simt: no assembly context switch on this architecture\n");
    std::abort();
#endif
  }
  if (!ucontext_) ucontext_ = std::make_unique<ucontext_t>();
  if (getcontext(ucontext_.get()) != 0) {
    std::perror("dcf simt: getcontext");
    std::abort();
  }
  ucontext_->uc_stack.ss_sp = stack;
  ucontext_->uc_stack.ss_size = size;
  ucontext_->uc_link = nullptr;
  // makecontext passes int arguments only: split `this` into two halves.
  const auto self = reinterpret_cast<uintptr_t>(this);
  makecontext(ucontext_.get(), reinterpret_cast<void (*)()>(&FiberContext::UcontextEntry), 2,
              static_cast<unsigned int>(self >> 32), static_cast<unsigned int>(self));
}

void FiberContext::UcontextEntry(unsigned int high, unsigned int low) {
  auto* self = reinterpret_cast<FiberContext*>((uintptr_t{high} << 32) | low);
  self->entry_(self->arg_);
  std::fprintf(stderr, "dcf simt: a fiber entry returned\n");
  std::abort();
}

void FiberContext::Switch(FiberContext& from, FiberContext& to) {
  from.kind_ = to.kind_;
  if (to.kind_ == ContextKind::kAssembly) {
#if defined(__x86_64__)
    dcf_simt_switch(&from.stack_pointer_, to.stack_pointer_);
    return;
#endif
  }
  if (!from.ucontext_) from.ucontext_ = std::make_unique<ucontext_t>();
  if (swapcontext(from.ucontext_.get(), to.ucontext_.get()) != 0) {
    std::perror("dcf simt: swapcontext");
    std::abort();
  }
}

}  // namespace dcf::simt::detail
