#include "engine/simt/schedule.h"

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <mutex>

#include "engine/simt/config.h"
#include "engine/simt/simt_testing.h"

namespace dcf::simt {
namespace {

struct ScheduleState {
  std::mutex mu;
  bool set = false;  // guarded by mu
  Schedule schedule;  // guarded by mu
};

std::atomic<uint64_t> serial{0};

ScheduleState& State() {
  static auto* state = new ScheduleState();
  return *state;
}

}  // namespace

std::string ScheduleName(const Schedule& s) {
  switch (s.kind) {
    case ScheduleKind::kLinear:
      return "linear";
    case ScheduleKind::kReverse:
      return "reverse";
    case ScheduleKind::kRandom:
      return "random:" + std::to_string(s.seed);
  }
  return "?";
}

bool ParseSchedule(const std::string& text, Schedule* out) {
  if (text == "linear") {
    *out = Schedule{ScheduleKind::kLinear, 0};
    return true;
  }
  if (text == "reverse") {
    *out = Schedule{ScheduleKind::kReverse, 0};
    return true;
  }
  const std::string prefix = "random:";
  if (text.compare(0, prefix.size(), prefix) != 0 || text.size() == prefix.size()) return false;
  const char* digits = text.c_str() + prefix.size();
  if (*digits < '0' || *digits > '9') return false;
  errno = 0;
  char* end = nullptr;
  const unsigned long long seed = std::strtoull(digits, &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *out = Schedule{ScheduleKind::kRandom, seed};
  return true;
}

void SetSchedule(const Schedule& schedule) {
  ScheduleState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  s.set = true;
  s.schedule = schedule;
  serial.store(0);
}

Schedule GetSchedule() { return detail::CurrentSchedule(); }

namespace detail {

Schedule CurrentSchedule() {
  ScheduleState& s = State();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.set) {
    s.schedule = GetConfig().schedule;
    s.set = true;
  }
  return s.schedule;
}

uint64_t NextScheduleSerial() { return serial.fetch_add(1, std::memory_order_relaxed); }

uint64_t ScheduleSeed(uint64_t seed, uint64_t a, uint64_t b) {
  ScheduleRng rng(seed ^ 0x5bd1e9955bd1e995ull);
  uint64_t h = rng.Next() ^ a;
  h = ScheduleRng(h).Next() ^ b;
  return ScheduleRng(h).Next();
}

void ScheduleOrder(const Schedule& s, uint64_t rng_seed, std::vector<int>& ids) {
  switch (s.kind) {
    case ScheduleKind::kLinear:
      return;
    case ScheduleKind::kReverse:
      for (size_t i = 0, j = ids.size(); i + 1 < j; ++i, --j) std::swap(ids[i], ids[j - 1]);
      return;
    case ScheduleKind::kRandom: {
      ScheduleRng rng(rng_seed);
      for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[rng.Below(i)]);
      return;
    }
  }
}

}  // namespace detail
}  // namespace dcf::simt
