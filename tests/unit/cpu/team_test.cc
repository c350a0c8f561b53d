// cpu::Team (engine/cpu/team.h): its barrier and loops on teams of std::threads (so
// ThreadSanitizer sees every synchronisation, scripts/sanitizers.sh), the sleeping path of
// the barrier, and products on a team against the same product on its own threads, bit for
// bit, for every weight type and row counts on both sides of every path of MatMul.
#include "engine/cpu/team.h"

#include <atomic>
#include <bit>
#include <chrono>
#include <cstdint>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "engine/cpu/packed_matrix.h"
#include "gtest/gtest.h"

namespace dcf::cpu {
namespace {

// RunTeam's teams are OpenMP threads, and libgomp is not built for ThreadSanitizer: it would
// see the region's start (the threads reading what the caller wrote) as a race. Those cases
// run in the plain and ASan passes; the teams of std::threads below run everywhere.
#if defined(__SANITIZE_THREAD__)
#define DCF_SKIP_OPENMP_UNDER_TSAN() GTEST_SKIP() << "libgomp is not instrumented for TSan"
#else
#define DCF_SKIP_OPENMP_UNDER_TSAN() (void)0
#endif

// fn(team) on `size` threads: this one (the leader) and size - 1 std::threads.
void OnThreads(int size, const std::function<void(Team&)>& fn) {
  TeamState state;
  state.Reset();
  std::vector<std::thread> others;
  for (int r = 1; r < size; ++r) {
    others.emplace_back([&, r] {
      Team team(&state, r, size);
      fn(team);
    });
  }
  Team leader(&state, 0, size);
  fn(leader);
  for (std::thread& t : others) t.join();
  EXPECT_EQ(state.sleepers.load(), 0u);
}

TEST(TeamTest, BarrierMakesEveryThreadsWritesVisibleToAll) {
  for (const int size : {1, 2, 3, 4}) {
    constexpr int kRounds = 2000;
    std::vector<int> slot(size, -1);  // plain ints: the barrier orders them
    std::atomic<int> wrong{0};
    OnThreads(size, [&](Team& team) {
      for (int round = 0; round < kRounds; ++round) {
        slot[team.rank()] = round;
        team.Barrier();
        for (int r = 0; r < size; ++r) wrong += slot[r] != round;
        team.Barrier();  // nobody writes the next round before all have read this one
      }
    });
    EXPECT_EQ(wrong.load(), 0) << size << " threads";
  }
}

TEST(TeamTest, ForEachRunsEveryIterationOnceWhateverTheCounts) {
  for (const int size : {1, 2, 3, 4}) {
    // Loops of 0 to 9 iterations and longer ones, one after the other (the two loop counters
    // alternate and are reset in between).
    std::vector<int64_t> lengths;
    for (int i = 0; i < 300; ++i) lengths.push_back(i % 10);
    for (int i = 0; i < 20; ++i) lengths.push_back(1000 + i);
    std::vector<std::vector<int>> runs(lengths.size());
    for (size_t k = 0; k < lengths.size(); ++k) runs[k].assign(lengths[k], 0);
    std::vector<int> by_rank(size, 0);
    int wrong = 0;  // the leader's count of iterations not run exactly once
    OnThreads(size, [&](Team& team) {
      for (size_t k = 0; k < lengths.size(); ++k) {
        team.ForEach(lengths[k], [&](int64_t i) {
          ++runs[k][i];
          ++by_rank[team.rank()];
        });
        // After the loop's barrier every iteration is done and visible. (No ASSERT here: a
        // leader that left the loops would leave the others at a barrier for good.)
        if (team.leader()) {
          for (int64_t i = 0; i < lengths[k]; ++i) wrong += runs[k][i] != 1;
        }
      }
    });
    EXPECT_EQ(wrong, 0) << size << " threads";
    int64_t total = 0;
    for (int64_t n : lengths) total += n;
    int64_t ran = 0;
    for (int n : by_rank) ran += n;
    EXPECT_EQ(ran, total) << size << " threads";
  }
}

// A thread that arrives long after the others (past Team::kSpinMicros) finds them asleep on
// the futex and wakes them.
TEST(TeamTest, ThreadsThatWaitedPastTheSpinSleepAndAreWoken) {
  constexpr int kSize = 3;
  std::atomic<int> passed{0};
  OnThreads(kSize, [&](Team& team) {
    for (int round = 0; round < 5; ++round) {
      if (team.leader()) {
        std::this_thread::sleep_for(std::chrono::microseconds(20 * Team::kSpinMicros));
      }
      team.Barrier();
      ++passed;
    }
  });
  EXPECT_EQ(passed.load(), 5 * kSize);
}

TEST(TeamTest, SleepersAreCountedWhileAsleep) {
  TeamState state;
  state.Reset();
  std::thread other([&] {
    Team team(&state, 1, 2);
    team.Barrier();
  });
  // The other thread spins, then sleeps: the leader sees it asleep before arriving.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (state.sleepers.load() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(Team::kSpinMicros));
  }
  EXPECT_EQ(state.sleepers.load(), 1u);
  Team leader(&state, 0, 2);
  leader.Barrier();
  other.join();
  EXPECT_EQ(state.sleepers.load(), 0u);
}

TEST(TeamTest, ATeamOfOneRunsInOrderAndNeverWaits) {
  TeamState state;
  state.Reset();
  Team team(&state, 0, 1);
  std::vector<int64_t> order;
  team.ForEach(5, [&](int64_t i) { order.push_back(i); });
  team.Barrier();
  EXPECT_EQ(order, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  // A team of one leaves the shared counters alone.
  EXPECT_EQ(state.next[0].load(), 0);
  EXPECT_EQ(state.arrived.load(), 0u);
}

// RunTeam on the OpenMP threads: every rank once, the caller the leader.
TEST(TeamTest, RunTeamGivesEveryRankOnce) {
  DCF_SKIP_OPENMP_UNDER_TSAN();
  std::vector<std::atomic<int>> ranks(8);
  int size = 0;
  const std::thread::id caller = std::this_thread::get_id();
  bool leader_is_caller = false;
  RunTeam(4, [&](Team& team) {
    ++ranks[team.rank()];
    if (team.leader()) {
      size = team.size();
      leader_is_caller = std::this_thread::get_id() == caller;
    }
    team.Barrier();
  });
  ASSERT_GE(size, 1);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(ranks[r].load(), r < size ? 1 : 0) << r;
  EXPECT_TRUE(leader_is_caller);
}

// A team's leader that starts a team of its own (the standalone MatMul or PagedAttention
// inside a step) runs it alone and leaves the running team's state alone: no deadlock, and
// the running team's loops and barriers go on.
TEST(TeamTest, ATeamStartedInsideATeamRunsAloneAndLeavesItBe) {
  DCF_SKIP_OPENMP_UNDER_TSAN();
  std::atomic<int> inner_sizes{0}, inner_runs{0}, iterations{0};
  int size = 0;
  RunTeam(2, [&](Team& team) {
    // The other thread is in the loop or at its barrier while the leader starts its own.
    if (team.leader()) {
      size = team.size();
      RunTeam(2, [&](Team& inner) {
        inner_sizes += inner.size();
        ++inner_runs;
        inner.Barrier();
      });
    }
    team.ForEach(64, [&](int64_t) { ++iterations; });
    team.Barrier();
  });
  EXPECT_EQ(iterations.load(), 64);
  ASSERT_GE(size, 1);
  EXPECT_EQ(inner_runs.load(), 1);
  EXPECT_EQ(inner_sizes.load(), 1);  // a team of one thread
}

// A product of no rows returns on every thread without a barrier (nothing to wait for) and
// writes nothing; the team goes on.
TEST(TeamTest, AProductOfNoRowsOnATeamWritesNothing) {
  std::mt19937 rng(2);
  std::vector<float> w(40 * 64, 0.5f);
  const PackedMatrix m = PackedMatrix::FromRows(w.data(), DType::kF32, 40, 64, DType::kF32);
  std::vector<float> x(64, 1.0f), y(40, -7.0f);
  MatMulScratch scratch;
  std::atomic<int> after{0};
  OnThreads(3, [&](Team& team) {
    MatMul(team, x.data(), 64, 0, m, nullptr, y.data(), 40, ActiveIsa(), &scratch);
    team.ForEach(3, [&](int64_t) { ++after; });
  });
  EXPECT_EQ(after.load(), 3);
  for (float v : y) EXPECT_EQ(v, -7.0f);
}

// The matrices of one weight type: F32, F16, BF16, int8 weight-only, int8 x int8.
struct Kind {
  const char* name;
  DType dtype;
  int group;  // int8: columns per scale
  bool activations;
};

PackedMatrix RandomMatrix(const Kind& k, int64_t out, int64_t in, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> w(out * in);
  for (float& v : w) v = u(rng);
  if (k.group > 0) {
    Int8Matrices int8;
    int8.group = k.group;
    int8.activations = k.activations;
    return PackedMatrix::QuantizeInt8({{w.data(), DType::kF32, out, false, in}}, in, int8);
  }
  return PackedMatrix::FromRows(w.data(), DType::kF32, out, in, k.dtype);
}

TEST(TeamTest, ProductsOnATeamGiveTheBitsOfTheProductAlone) {
  const Kind kinds[] = {{"f32", DType::kF32, 0, false},
                        {"f16", DType::kF16, 0, false},
                        {"bf16", DType::kBF16, 0, false},
                        {"int8", DType::kF32, 64, false},
                        {"int8a8", DType::kF32, 64, true}};
  // (out, in): a partial last panel; x of one pass or of many (the blocked path from 13
  // rows of 8197 columns, StreamsPanels); rows below and above every threshold of MatMul
  // (4 rows: packed once; int8 x int8 quantized on the threads from 32k elements).
  const std::pair<int64_t, int64_t> shapes[] = {{45, 300}, {200, 1027}, {70, 8197}};
  std::mt19937 rng(11);
  int compared = 0;
  for (const Kind& k : kinds) {
    for (const auto& [out, in] : shapes) {
      const PackedMatrix m = RandomMatrix(k, out, in, rng);
      for (const int64_t rows : {1, 2, 3, 4, 12, 13, 29, 48}) {
        std::uniform_real_distribution<float> u(-1, 1);
        std::vector<float> x(rows * in), bias(out);
        for (float& v : x) v = u(rng);
        for (float& v : bias) v = u(rng);
        std::vector<float> want(rows * out);
        MatMul(x.data(), in, rows, m, bias.data(), want.data(), out);
        for (const int size : {1, 2, 3}) {
          std::vector<float> got(rows * out, -7.0f);
          MatMulScratch scratch;
          OnThreads(size, [&](Team& team) {
            MatMul(team, x.data(), in, rows, m, bias.data(), got.data(), out, ActiveIsa(),
                   &scratch);
          });
          for (int64_t i = 0; i < rows * out; ++i) {
            ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
                << k.name << " out " << out << " in " << in << " rows " << rows << " team "
                << size << " at " << i;
          }
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, 5 * 3 * 8 * 3);
}

}  // namespace
}  // namespace dcf::cpu
