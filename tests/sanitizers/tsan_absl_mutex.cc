// ThreadSanitizer builds only: makes Debian's prebuilt (uninstrumented) absl::Mutex visible
// to TSan.
//
// TSan learns about synchronisation from instrumented code and from the pthread calls it
// intercepts. absl::Mutex is neither: it lives in libabsl_synchronization.so, compiled
// without -fsanitize=thread, and sleeps on futexes. Every hand-off through it (the engine
// inbox, RequestStream, the reactors, the writer pool) would be reported as a data race. This
// file defines absl::Mutex's and absl::CondVar's out-of-line members in the executable, which
// takes precedence over the shared library's definitions for every caller (ours and
// libabsl's own calls through the PLT); each forwards to the real one (dlsym RTLD_NEXT) and
// tells TSan what it did: __tsan_acquire(mu) after taking the lock, __tsan_release(mu) before
// letting it go (Await/Wait let it go and take it back inside the call).
//
// absl also evaluates a waiter's Condition on whichever thread releases the mutex (inside
// Unlock) and on the waiter while it is inside Await/LockWhen, at points this wrapper cannot
// annotate. Those evaluations happen under the mutex by absl's design and only read, so the
// reads made inside those calls are hidden from TSan (AnnotateIgnoreReads); writes are not.
//
// The symbol names are those of Debian 12's Abseil (inline namespace "debian3"); a static
// assert stops the build when that changes. Linked into every target of a
// -DDCFORMER_SANITIZE=thread build (top-level CMakeLists.txt); never into anything else.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>
#include <type_traits>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);

// The mangled names below spell absl's inline namespace: fail here, not at run time.
static_assert(std::is_same_v<absl::Mutex, absl::debian3::Mutex>,
              "tsan_absl_mutex.cc names Debian 12's absl symbols (inline namespace debian3)");

namespace {

template <typename Fn>
Fn Real(const char* symbol) {
  void* f = dlsym(RTLD_NEXT, symbol);
  if (f == nullptr) {
    std::fprintf(stderr, "tsan_absl_mutex: %s not found: %s\n", symbol, dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(f);
}

#define REAL(type, symbol)                       \
  static const auto real = Real<type>(symbol);   \
  (void)0

using MuFn = void (*)(absl::Mutex*);
using MuBoolFn = bool (*)(absl::Mutex*);
using MuCondFn = void (*)(absl::Mutex*, const absl::Condition&);
using MuCondTimeoutFn = bool (*)(absl::Mutex*, const absl::Condition&, absl::Duration);
using MuCondDeadlineFn = bool (*)(absl::Mutex*, const absl::Condition&, absl::Time);
using CvWaitFn = void (*)(absl::CondVar*, absl::Mutex*);
using CvTimeoutFn = bool (*)(absl::CondVar*, absl::Mutex*, absl::Duration);
using CvDeadlineFn = bool (*)(absl::CondVar*, absl::Mutex*, absl::Time);
using NotifyFn = void (*)(absl::Notification*);
using WaitFn = void (*)(const absl::Notification*);
using WaitTimeoutFn = bool (*)(const absl::Notification*, absl::Duration);
using WaitDeadlineFn = bool (*)(const absl::Notification*, absl::Time);

// Runs `f` with TSan ignoring this thread's reads (Condition evaluation inside absl).
template <typename F>
auto IgnoringReads(F f) {
  AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
  auto result = f();
  AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
  return result;
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  REAL(MuFn, "_ZN4absl7debian35Mutex4LockEv");
  real(this);
  __tsan_acquire(this);
}
void Mutex::ReaderLock() {
  REAL(MuFn, "_ZN4absl7debian35Mutex10ReaderLockEv");
  real(this);
  __tsan_acquire(this);
}
bool Mutex::TryLock() {
  REAL(MuBoolFn, "_ZN4absl7debian35Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}
bool Mutex::ReaderTryLock() {
  REAL(MuBoolFn, "_ZN4absl7debian35Mutex13ReaderTryLockEv");
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}
void Mutex::Unlock() {
  REAL(MuFn, "_ZN4absl7debian35Mutex6UnlockEv");
  __tsan_release(this);
  IgnoringReads([&] { return (real(this), 0); });
}
void Mutex::ReaderUnlock() {
  REAL(MuFn, "_ZN4absl7debian35Mutex12ReaderUnlockEv");
  __tsan_release(this);
  IgnoringReads([&] { return (real(this), 0); });
}
void Mutex::Await(const Condition& cond) {
  REAL(MuCondFn, "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  __tsan_release(this);
  IgnoringReads([&] { return (real(this, cond), 0); });
  __tsan_acquire(this);
}
bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  REAL(MuCondTimeoutFn, "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  __tsan_release(this);
  const bool met = IgnoringReads([&] { return real(this, cond, timeout); });
  __tsan_acquire(this);
  return met;
}
bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  REAL(MuCondDeadlineFn, "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  __tsan_release(this);
  const bool met = IgnoringReads([&] { return real(this, cond, deadline); });
  __tsan_acquire(this);
  return met;
}
void Mutex::LockWhen(const Condition& cond) {
  REAL(MuCondFn, "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  IgnoringReads([&] { return (real(this, cond), 0); });
  __tsan_acquire(this);
}
void Mutex::ReaderLockWhen(const Condition& cond) {
  REAL(MuCondFn, "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE");
  IgnoringReads([&] { return (real(this, cond), 0); });
  __tsan_acquire(this);
}
bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  REAL(MuCondTimeoutFn,
       "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  const bool met = IgnoringReads([&] { return real(this, cond, timeout); });
  __tsan_acquire(this);
  return met;
}
bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  REAL(MuCondDeadlineFn,
       "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  const bool met = IgnoringReads([&] { return real(this, cond, deadline); });
  __tsan_acquire(this);
  return met;
}
void CondVar::Wait(Mutex* mu) {
  REAL(CvWaitFn, "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  __tsan_release(mu);
  real(this, mu);
  __tsan_acquire(mu);
}
bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  REAL(CvTimeoutFn, "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  __tsan_release(mu);
  const bool timed_out = real(this, mu, timeout);
  __tsan_acquire(mu);
  return timed_out;
}
bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  REAL(CvDeadlineFn, "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  __tsan_release(mu);
  const bool timed_out = real(this, mu, deadline);
  __tsan_acquire(mu);
  return timed_out;
}

// Notification's waits return on an atomic flag without taking its mutex: pair Notify with
// the waits directly. (HasBeenNotified() is inline and stays unannotated.)
void Notification::Notify() {
  REAL(NotifyFn, "_ZN4absl7debian312Notification6NotifyEv");
  __tsan_release(this);
  real(this);
}
void Notification::WaitForNotification() const {
  REAL(WaitFn, "_ZNK4absl7debian312Notification19WaitForNotificationEv");
  real(this);
  __tsan_acquire(const_cast<Notification*>(this));
}
bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  REAL(WaitTimeoutFn,
       "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool notified = real(this, timeout);
  if (notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}
bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  REAL(WaitDeadlineFn,
       "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool notified = real(this, deadline);
  if (notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl
