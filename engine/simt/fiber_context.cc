#include "engine/simt/fiber_context.h"

#include <ucontext.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DCF_SIMT_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define DCF_SIMT_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) && !defined(DCF_SIMT_ASAN)
#define DCF_SIMT_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__) && !defined(DCF_SIMT_TSAN)
#define DCF_SIMT_TSAN 1
#endif
#if defined(DCF_SIMT_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(DCF_SIMT_TSAN)
#include <sanitizer/tsan_interface.h>
#endif

// dcf_simt_switch(void** save_sp, void* load_sp): pushes the callee-saved registers of the
// System V x86-64 ABI, stores the stack pointer in *save_sp, loads load_sp and pops the same
// frame from there. MXCSR and the x87 control word are not switched: all fibers of a block run
// on one OS thread and share its floating-point environment (kernels have no way to change
// rounding modes), and ldmxcsr/fldcw cost more than the rest of the switch (9 ns without them,
// 14-28 ns with them, on the 2-core CI-like machine). A fresh context's frame is
// built by Prepare() so that the final `ret` enters dcf_simt_fiber_start with
// FiberContext::Start in r12 and the context in r13. The start routine marks the end of the call stack for
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

namespace {
#if defined(DCF_SIMT_ASAN)
// The context the running switch left (set just before it): the resumed side records the
// stack ASan reports it was running on.
thread_local FiberContext* switching_from = nullptr;
#endif
}  // namespace

FiberContext::FiberContext() = default;

FiberContext::~FiberContext() {
#if defined(DCF_SIMT_TSAN)
  if (tsan_fiber_owned_) __tsan_destroy_fiber(tsan_fiber_);
#endif
}

FiberContext::FiberContext(FiberContext&& other) noexcept { *this = std::move(other); }

FiberContext& FiberContext::operator=(FiberContext&& other) noexcept {
  if (this == &other) return *this;
  std::swap(kind_, other.kind_);
  std::swap(stack_pointer_, other.stack_pointer_);
  std::swap(ucontext_, other.ucontext_);
  std::swap(entry_, other.entry_);
  std::swap(arg_, other.arg_);
  std::swap(stack_bottom_, other.stack_bottom_);
  std::swap(stack_bytes_, other.stack_bytes_);
  std::swap(asan_fake_stack_, other.asan_fake_stack_);
  std::swap(tsan_fiber_, other.tsan_fiber_);
  std::swap(tsan_fiber_owned_, other.tsan_fiber_owned_);
  return *this;
}

void FiberContext::Start(void* self_ptr) {
  auto* self = static_cast<FiberContext*>(self_ptr);
  FinishSwitch(nullptr);
  self->entry_(self->arg_);
  std::fprintf(stderr, "dcf simt: a fiber entry returned\n");
  std::abort();
}

void FiberContext::FinishSwitch([[maybe_unused]] void* fake_stack) {
#if defined(DCF_SIMT_ASAN)
  const void* bottom = nullptr;
  size_t bytes = 0;
  __sanitizer_finish_switch_fiber(fake_stack, &bottom, &bytes);
  if (switching_from != nullptr) {
    switching_from->stack_bottom_ = bottom;
    switching_from->stack_bytes_ = bytes;
    switching_from = nullptr;
  }
#endif
}

void FiberContext::Prepare(ContextKind kind, void* stack, size_t size, void (*entry)(void*),
                           void* arg) {
  kind_ = kind;
  entry_ = entry;
  arg_ = arg;
  stack_bottom_ = stack;
  stack_bytes_ = size;
  asan_fake_stack_ = nullptr;
#if defined(DCF_SIMT_ASAN)
  __asan_unpoison_memory_region(stack, size);
#endif
#if defined(DCF_SIMT_TSAN)
  if (tsan_fiber_owned_) __tsan_destroy_fiber(tsan_fiber_);
  tsan_fiber_ = __tsan_create_fiber(0);
  tsan_fiber_owned_ = true;
#endif
  if (kind == ContextKind::kAssembly) {
#if defined(__x86_64__)
    // Frame popped by dcf_simt_switch, lowest address first: r15, r14, r13, r12, rbx, rbp,
    // return address. After the `ret` the stack pointer must be 16-byte aligned
    // (dcf_simt_fiber_start calls the entry), so the return address sits at top - 24.
    auto top = (reinterpret_cast<uintptr_t>(stack) + size) & ~uintptr_t{15};
    auto* frame = reinterpret_cast<uint64_t*>(top - 24 - 6 * 8);
    frame[0] = 0;                                  // r15
    frame[1] = 0;                                  // r14
    frame[2] = reinterpret_cast<uint64_t>(this);                     // r13
    frame[3] = reinterpret_cast<uint64_t>(&FiberContext::Start);  // r12
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
  Start(reinterpret_cast<FiberContext*>((uintptr_t{high} << 32) | low));
}

void FiberContext::Switch(FiberContext& from, FiberContext& to, [[maybe_unused]] bool from_ends) {
  from.kind_ = to.kind_;
#if defined(DCF_SIMT_ASAN)
  switching_from = &from;
  __sanitizer_start_switch_fiber(from_ends ? nullptr : &from.asan_fake_stack_, to.stack_bottom_,
                                 to.stack_bytes_);
#endif
#if defined(DCF_SIMT_TSAN)
  if (!from.tsan_fiber_owned_) from.tsan_fiber_ = __tsan_get_current_fiber();
  __tsan_switch_to_fiber(to.tsan_fiber_, 0);
#endif
  if (to.kind_ == ContextKind::kAssembly) {
#if defined(__x86_64__)
    dcf_simt_switch(&from.stack_pointer_, to.stack_pointer_);
    FinishSwitch(from.asan_fake_stack_);
    return;
#endif
  }
  if (!from.ucontext_) from.ucontext_ = std::make_unique<ucontext_t>();
  if (swapcontext(from.ucontext_.get(), to.ucontext_.get()) != 0) {
    std::perror("dcf simt: swapcontext");
    std::abort();
  }
  FinishSwitch(from.asan_fake_stack_);
}

}  // namespace dcf::simt::detail
