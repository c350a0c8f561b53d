#include "engine/simt/block_runner.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "engine/simt/config.h"
#include "engine/simt/error_state.h"

namespace dcf::simt::detail {
namespace {

thread_local BlockRunner* active_runner = nullptr;

std::string Format(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string Format(const char* format, ...) {
  char text[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof(text), format, args);
  va_end(args);
  return text;
}

std::string Site(const std::source_location& where) { return SourceSite(where); }

bool SameSite(const std::source_location& a, const std::source_location& b) {
  return a.line() == b.line() && a.column() == b.column() &&
         (a.file_name() == b.file_name() || std::strcmp(a.file_name(), b.file_name()) == 0);
}

BlockRunner& ActiveOrDie(const char* what) {
  if (active_runner == nullptr) {
    std::fprintf(stderr, "dcf simt: %s used outside a kernel launched with DCF_LAUNCH\n", what);
    std::abort();
  }
  return *active_runner;
}

}  // namespace

BlockRunner::BlockRunner() : stacks_(GetConfig().stack_bytes) {}
BlockRunner::~BlockRunner() = default;

BlockRunner& BlockRunner::ForThisThread() {
  thread_local std::unique_ptr<BlockRunner> runner = std::make_unique<BlockRunner>();
  return *runner;
}

BlockRunner* BlockRunner::Active() { return active_runner; }

bool BlockRunner::Run(const LaunchRequest& request, size_t shared_limit_bytes, uint3 block_idx,
                      uint64_t schedule_seed) {
  const dim3 block = request.block;
  num_threads_ = static_cast<int>(block.x * block.y * block.z);
  request_ = &request;
  coords_ = BlockCoords{block_idx, request.block, request.grid};
  if (static_cast<int>(threads_.size()) < num_threads_) threads_.resize(num_threads_);
  stacks_.Reserve(num_threads_);
  const ContextKind kind = GetConfig().context_kind;
  ready_.assign(num_threads_, 0);
  ready_head_ = 0;
  ready_count_ = 0;
  schedule_ = CurrentSchedule();
  rng_ = ScheduleRng(schedule_seed);
  release_.clear();
  for (int i = 0; i < num_threads_; ++i) {
    Thread& t = threads_[i];
    const auto id = static_cast<unsigned int>(i);
    t.thread_idx = uint3{id % block.x, id / block.x % block.y, id / (block.x * block.y)};
    t.id = i;
    t.state = State::kReady;
    t.context.Prepare(kind, stacks_.stack(i), stacks_.stack_bytes(), &BlockRunner::FiberMain, &t);
    release_.push_back(i);
  }
  Release(release_);
  warp_waiting_.assign((num_threads_ + kWarpSize - 1) / kWarpSize, 0);
  warp_blocked_.assign(warp_waiting_.size(), 0);
  exited_ = 0;
  first_exited_ = -1;
  at_barrier_ = 0;
  barrier_first_ = -1;
  barrier_released_ = false;
  faulted_ = false;
  shared_.Reset(request.dynamic_shared_bytes, shared_limit_bytes);
  racecheck_ = GetConfig().racecheck;
  if (racecheck_) {
    race_.BeginBlock(shared_.base(), SharedArena::capacity(), (num_threads_ + kWarpSize - 1) / kWarpSize);
  }

  active_runner = this;
  current_block = &coords_;
  FiberStacks::SetActive(&stacks_, request.kernel_name);
  racecheck_active = racecheck_;
  while (!faulted_) {
    const int next = PopReady();
    if (next < 0) {
      if (exited_ != num_threads_) DiagnoseDeadlock();
      break;
    }
    Enter(scheduler_, threads_[next]);
  }
  racecheck_active = false;
  current_ = nullptr;
  current_thread_idx = nullptr;
  current_block = nullptr;
  active_runner = nullptr;
  FiberStacks::SetActive(nullptr, nullptr);
  return !faulted_;
}

namespace {
// Thrown by Fault: unwinds the faulting fiber's frames (their destructors run, so what they
// own is freed, as LeakSanitizer requires) up to FiberMain.
struct FiberFault {};
}  // namespace

void BlockRunner::FiberMain(void* thread) {
  BlockRunner& runner = *active_runner;
  Thread& self = *static_cast<Thread*>(thread);
  try {
    runner.request_->body(runner.request_->args);
    runner.Exit(self);  // switches away for good
  } catch (const FiberFault&) {
  }
  FiberContext::Switch(self.context, runner.scheduler_, /*from_ends=*/true);
  std::fprintf(stderr, "dcf simt: a faulted fiber was resumed\n");
  std::abort();
}

void BlockRunner::EndSegment(Thread& self) {
  if (!racecheck_) return;
  RaceCheck::Hazard h;
  if (race_.EndSegment(self.id, self.id / kWarpSize, &h)) return;
  const std::string since =
      barrier_released_ ? "the __syncthreads at " + Site(last_barrier_site_) : "the block's start";
  Fault(Format("racecheck: %s hazard on shared array '%s' element %lld: %s %s it and %s %s it "
               "with no barrier between (since %s)%s",
               h.kind, h.name, h.index, Describe(threads_[h.other_thread]).c_str(),
               h.other_wrote ? "wrote" : "read", Describe(self).c_str(),
               h.kind[0] == 'R' ? "reads" : "writes", since.c_str(),
               h.other_thread / kWarpSize == self.id / kWarpSize ? ", nor a warp collective" : ""));
}

void BlockRunner::Exit(Thread& self) {
  EndSegment(self);
  self.state = State::kExited;
  ++exited_;
  ++warp_blocked_[self.id / kWarpSize];
  if (first_exited_ < 0) first_exited_ = self.id;
  if (at_barrier_ > 0) {
    Fault(
        Format("exits while %d thread(s) wait at __syncthreads at %s: a barrier must be "
               "reached by every thread of the block",
               at_barrier_, Site(barrier_site_).c_str()));
  }
  if (const Thread* waiter = WarpWaiterFor(self)) {
    Fault(Format("exits while lane %d (%s) waits for it at %s at %s with mask 0x%08x",
                 waiter->id % kWarpSize, Describe(*waiter).c_str(), WarpOpName(waiter->request.op),
                 Site(waiter->where).c_str(), waiter->request.mask));
  }
  SwitchAway(self, /*self_ends=*/true);
  std::fprintf(stderr, "dcf simt: an exited fiber was resumed\n");
  std::abort();
}

void BlockRunner::SwitchAway(Thread& self, bool self_ends) {
  const int next = PopReady();
  if (next >= 0) {
    Enter(self.context, threads_[next], self_ends);
  } else {
    current_ = nullptr;
    FiberContext::Switch(self.context, scheduler_, self_ends);
  }
}

void BlockRunner::YieldReleased(Thread& self) {
  // `self` is in the ready queue with the threads it released: they all resume in the
  // schedule's order, `self` included.
  const int next = PopReady();
  if (next == self.id) {
    self.state = State::kRunning;
    current_ = &self;
    current_thread_idx = &self.thread_idx;
    return;
  }
  Enter(self.context, threads_[next]);
}

void BlockRunner::Enter(FiberContext& from, Thread& next, bool from_ends) {
  next.state = State::kRunning;
  current_ = &next;
  current_thread_idx = &next.thread_idx;
  FiberContext::Switch(from, next.context, from_ends);
}

void BlockRunner::PushReady(int id) {
  ready_[(ready_head_ + ready_count_) % num_threads_] = id;
  ++ready_count_;
}

void BlockRunner::Release(std::vector<int>& ids) {
  switch (schedule_.kind) {
    case ScheduleKind::kLinear:
      for (int id : ids) PushReady(id);
      break;
    case ScheduleKind::kReverse:
      for (auto it = ids.rbegin(); it != ids.rend(); ++it) PushReady(*it);
      break;
    case ScheduleKind::kRandom:
      for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[rng_.Below(i)]);
      for (int id : ids) PushReady(id);
      break;
  }
}

int BlockRunner::PopReady() {
  if (ready_count_ == 0) return -1;
  const int id = ready_[ready_head_];
  ready_head_ = (ready_head_ + 1) % num_threads_;
  --ready_count_;
  return id;
}

const BlockRunner::Thread* BlockRunner::WarpWaiterFor(const Thread& t) const {
  const int base = t.id / kWarpSize * kWarpSize;
  const int lane = t.id % kWarpSize;
  if (warp_waiting_[t.id / kWarpSize] == 0) return nullptr;
  for (int i = base; i < base + kWarpSize && i < num_threads_; ++i) {
    const Thread& o = threads_[i];
    if (o.state == State::kAtWarpOp && (o.request.mask >> lane & 1u)) return &o;
  }
  return nullptr;
}

void BlockRunner::SyncThreads(const std::source_location& where) {
  Thread& self = *current_;
  if (first_exited_ >= 0) {
    Fault(Format("__syncthreads at %s is reached by only %d of %d threads: %s exited before it",
                 Site(where).c_str(), num_threads_ - exited_, num_threads_,
                 Describe(threads_[first_exited_]).c_str()));
  }
  if (at_barrier_ > 0 && !SameSite(where, barrier_site_)) {
    Fault(
        Format("waits at __syncthreads at %s while %s waits at a different __syncthreads at "
               "%s: all threads must reach the same barrier",
               Site(where).c_str(), Describe(threads_[barrier_first_]).c_str(),
               Site(barrier_site_).c_str()));
  }
  if (const Thread* waiter = WarpWaiterFor(self)) {
    Fault(
        Format("waits at __syncthreads at %s while lane %d (%s) waits for it at %s at %s "
               "with mask 0x%08x",
               Site(where).c_str(), waiter->id % kWarpSize, Describe(*waiter).c_str(),
               WarpOpName(waiter->request.op), Site(waiter->where).c_str(), waiter->request.mask));
  }
  EndSegment(self);
  if (at_barrier_ == 0) {
    barrier_site_ = where;
    barrier_first_ = self.id;
  }
  if (++at_barrier_ == num_threads_) {
    if (racecheck_) race_.BarrierReleased();
    barrier_released_ = true;
    last_barrier_site_ = barrier_site_;
    // The last thread releases the others (in linear order) and carries on itself.
    // Nobody has exited (checked above), so no lane is blocked any more.
    at_barrier_ = 0;
    release_.clear();
    for (int i = 0; i < num_threads_; ++i) {
      threads_[i].state = State::kReady;
      release_.push_back(i);
    }
    std::fill(warp_blocked_.begin(), warp_blocked_.end(), 0);
    Release(release_);
    YieldReleased(self);
    return;
  }
  self.state = State::kAtBarrier;
  self.where = where;
  ++warp_blocked_[self.id / kWarpSize];
  SwitchAway(self);
}

uint64_t BlockRunner::WarpCollective(WarpOp op, unsigned int mask, uint64_t value, int arg,
                                     int width, const std::source_location& where) {
  Thread& self = *current_;
  const int lane = self.id % kWarpSize;
  const int warp = self.id / kWarpSize;
  const int base = warp * kWarpSize;
  const int lanes_in_warp = num_threads_ - base < kWarpSize ? num_threads_ - base : kWarpSize;
  const unsigned int existing =
      lanes_in_warp == kWarpSize ? 0xffffffffu : (1u << lanes_in_warp) - 1u;
  const char* name = WarpOpName(op);
  if (!(mask >> lane & 1u)) {
    Fault(Format("%s at %s: mask 0x%08x does not name the calling lane %d", name,
                 Site(where).c_str(), mask, lane));
  }
  if ((mask & ~existing) != 0) {
    Fault(
        Format("%s at %s: mask 0x%08x names lanes that do not exist (warp %d of this "
               "%d-thread block has lanes 0..%d)",
               name, Site(where).c_str(), mask, warp, num_threads_, lanes_in_warp - 1));
  }
  if (IsShuffle(op) && (width < 1 || width > kWarpSize || (width & (width - 1)) != 0)) {
    Fault(Format("%s at %s: width %d is not a power of two in [1, 32]", name, Site(where).c_str(),
                 width));
  }
  // Lanes that exited or wait at __syncthreads can never arrive: look for them only when the
  // warp has any (the common path costs two loads).
  for (int l = 0; warp_blocked_[warp] > 0 && l < lanes_in_warp; ++l) {
    if (l == lane || !(mask >> l & 1u)) continue;
    const Thread& o = threads_[base + l];
    if (o.state == State::kExited) {
      Fault(Format("%s at %s with mask 0x%08x: lane %d (%s) has exited and never arrives", name,
                   Site(where).c_str(), mask, l, Describe(o).c_str()));
    }
    if (o.state == State::kAtBarrier) {
      Fault(
          Format("%s at %s with mask 0x%08x: lane %d (%s) waits at __syncthreads at %s and "
                 "never arrives",
                 name, Site(where).c_str(), mask, l, Describe(o).c_str(), Site(o.where).c_str()));
    }
  }
  EndSegment(self);
  self.request = LaneRequest{op, mask, arg, width, value};
  self.where = where;
  self.state = State::kAtWarpOp;
  ++warp_waiting_[warp];

  bool complete = warp_waiting_[warp] >= __builtin_popcount(mask);
  for (int l = 0; complete && l < lanes_in_warp; ++l) {
    if (!(mask >> l & 1u)) continue;
    const Thread& o = threads_[base + l];
    complete = o.state == State::kAtWarpOp && o.request.op == op && o.request.mask == mask;
  }
  if (!complete) {
    SwitchAway(self);
    return self.result;
  }
  // The last lane to arrive computes every lane's result, releases the others and goes on.
  const LaneRequest* lanes[kWarpSize] = {};
  uint64_t results[kWarpSize] = {};
  for (int l = 0; l < lanes_in_warp; ++l) {
    if (mask >> l & 1u) lanes[l] = &threads_[base + l].request;
  }
  int bad_lane = 0;
  int bad_source = 0;
  if (!ResolveCollective(mask, lanes, results, &bad_lane, &bad_source)) {
    Fault(
        Format("%s at %s: lane %d (%s) reads lane %d, which is not in mask 0x%08x (the value "
               "is undefined in CUDA)",
               name, Site(where).c_str(), bad_lane, Describe(threads_[base + bad_lane]).c_str(),
               bad_source, mask));
  }
  release_.clear();
  for (int l = 0; l < lanes_in_warp; ++l) {
    if (!(mask >> l & 1u)) continue;
    Thread& o = threads_[base + l];
    o.result = results[l];
    --warp_waiting_[warp];
    o.state = State::kReady;
    release_.push_back(o.id);
  }
  if (racecheck_) race_.WarpReleased(warp);
  Release(release_);
  YieldReleased(self);
  return results[lane];
}

void* BlockRunner::StaticShared(const void* key, size_t bytes, size_t align, const char* name) {
  std::string error;
  void* data = shared_.Static(key, bytes, align, name, &error);
  if (data == nullptr) Fault(error);
  return data;
}

DynamicSharedSpan BlockRunner::DynamicShared() {
  return DynamicSharedSpan{shared_.dynamic_data(), shared_.dynamic_bytes()};
}

void BlockRunner::Fault(const std::string& what) {
  Thread& self = *current_;
  ReportViolation(Prefix(self) + what);
  faulted_ = true;
  current_ = nullptr;
  throw FiberFault{};  // caught in FiberMain, which leaves the fiber for good
}

void BlockRunner::DiagnoseDeadlock() {
  // Only collectives can wait forever without being caught on arrival: lanes named in a
  // mask wait at a collective of another kind or with another mask.
  for (int i = 0; i < num_threads_; ++i) {
    const Thread& t = threads_[i];
    if (t.state != State::kAtWarpOp) continue;
    const int base = i / kWarpSize * kWarpSize;
    for (int l = 0; l < kWarpSize; ++l) {
      if (!(t.request.mask >> l & 1u)) continue;
      const Thread& o = threads_[base + l];
      if (o.state == State::kAtWarpOp && o.request.op == t.request.op &&
          o.request.mask == t.request.mask) {
        continue;
      }
      ReportViolation(
          Prefix(t) +
          Format("%s at %s with mask 0x%08x never completes: lane %d (%s) waits at %s at %s "
                 "with mask 0x%08x",
                 WarpOpName(t.request.op), Site(t.where).c_str(), t.request.mask, l,
                 Describe(o).c_str(), WarpOpName(o.request.op), Site(o.where).c_str(),
                 o.request.mask));
      faulted_ = true;
      return;
    }
  }
  ReportViolation(
      Format("kernel '%s' block (%u,%u,%u): deadlock: %d of %d threads wait and "
             "none can proceed",
             request_->kernel_name, coords_.block_idx.x, coords_.block_idx.y, coords_.block_idx.z,
             num_threads_ - exited_, num_threads_));
  faulted_ = true;
}

std::string BlockRunner::Describe(const Thread& t) const {
  return Format("thread (%u,%u,%u)", t.thread_idx.x, t.thread_idx.y, t.thread_idx.z);
}

std::string BlockRunner::Prefix(const Thread& t) const {
  return Format("kernel '%s' block (%u,%u,%u) %s: ", request_->kernel_name, coords_.block_idx.x,
                coords_.block_idx.y, coords_.block_idx.z, Describe(t).c_str());
}

// The kernel-facing entry points (warp_ops.h, shared_memory.h).

void SyncThreads(const std::source_location& where) {
  ActiveOrDie("__syncthreads").SyncThreads(where);
}

uint64_t WarpCollective(WarpOp op, unsigned int mask, uint64_t value, int arg, int width,
                        const std::source_location& where) {
  return ActiveOrDie(WarpOpName(op)).WarpCollective(op, mask, value, arg, width, where);
}

void* StaticShared(const void* key, size_t bytes, size_t align, const char* name) {
  return ActiveOrDie("DCF_SHARED").StaticShared(key, bytes, align, name);
}

DynamicSharedSpan DynamicShared() { return ActiveOrDie("DCF_DYNAMIC_SHARED").DynamicShared(); }

void SharedIndexFault(const char* name, long long index, size_t size) {
  ActiveOrDie("a shared array")
      .Fault(Format("shared array '%s': index %lld is out of bounds [0, %zu)", name, index, size));
}

void SharedIndexFault(const char* name, unsigned long long index, size_t size) {
  ActiveOrDie("a shared array")
      .Fault(Format("shared array '%s': index %llu is out of bounds [0, %zu)", name, index, size));
}

}  // namespace dcf::simt::detail
