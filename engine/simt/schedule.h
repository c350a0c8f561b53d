// The emulator's schedule: the order in which it makes the choices a GPU leaves open, so
// that a kernel (or a host program) depending on one of them shows it by giving different
// results under different schedules. DCF_SIMT_SCHEDULE selects it (config.h):
//   linear        (default) blocks in linear order; a block's threads start in linear order
//                 and, released from a barrier or collective, resume in linear order; a
//                 wait runs independent stream work in issue order;
//   reverse       all three in reverse;
//   random:SEED   all three in a pseudo-random order drawn from SEED, the same every run.
// Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dcf::simt {

enum class ScheduleKind : uint8_t { kLinear, kReverse, kRandom };

struct Schedule {
  ScheduleKind kind = ScheduleKind::kLinear;
  uint64_t seed = 0;  // kRandom
};

// "linear", "reverse" or "random:SEED".
std::string ScheduleName(const Schedule& s);
// Parses the forms above; false when `text` is none of them.
bool ParseSchedule(const std::string& text, Schedule* out);

namespace detail {

// The schedule in force: DCF_SIMT_SCHEDULE, or what SetSchedule (simt_testing.h) set.
Schedule CurrentSchedule();

// SplitMix64: a small deterministic generator for the random schedule's choices.
class ScheduleRng {
 public:
  explicit ScheduleRng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n), n > 0.
  uint64_t Below(uint64_t n) { return Next() % n; }

 private:
  uint64_t state_;
};

// The next number of the schedule's sequence of decisions (a grid's block order, a wait's
// choice, a graph launch's node order): with kRandom each decision's seed mixes it in, so a
// program replays the same choices run after run. SetSchedule restarts the sequence.
uint64_t NextScheduleSerial();

// A seed for one decision stream of the random schedule: mixes the schedule's seed with
// `a` and `b` (e.g. a launch's sequence number and a block index).
uint64_t ScheduleSeed(uint64_t seed, uint64_t a, uint64_t b);

// Orders `ids` (given in linear order) in place as `s` prescribes; `rng_seed` feeds kRandom.
void ScheduleOrder(const Schedule& s, uint64_t rng_seed, std::vector<int>& ids);

}  // namespace detail
}  // namespace dcf::simt
