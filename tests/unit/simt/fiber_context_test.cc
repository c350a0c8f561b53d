// The context switch under the emulator's fibers, for both implementations: control moves
// exactly where asked, callee-saved and floating-point state survive switches, and a fiber
// keeps its own stack.
#include "engine/simt/fiber_context.h"

#include <cmath>
#include <vector>

#include "engine/simt/config.h"
#include "engine/simt/fiber_stacks.h"
#include "gtest/gtest.h"

namespace dcf::simt::detail {
namespace {

struct PingPong {
  FiberContext main;
  FiberContext fibers[2];
  std::vector<int> trace;
  int rounds = 0;
};

PingPong* current = nullptr;

void FiberBody(void* arg) {
  const int id = static_cast<int>(reinterpret_cast<intptr_t>(arg));
  PingPong& p = *current;
  // Locals that must survive every switch (kept in callee-saved registers or on the stack).
  double accumulator = 1.0 + id;
  volatile char stack_marker[256];
  for (int i = 0; i < 256; ++i) stack_marker[i] = static_cast<char>(id + i);
  for (int round = 0; round < p.rounds; ++round) {
    p.trace.push_back(id * 1000 + round);
    accumulator = accumulator * 1.5 + std::sqrt(static_cast<double>(round));
    FiberContext::Switch(p.fibers[id], id == 0 ? p.fibers[1] : p.main);
  }
  for (int i = 0; i < 256; ++i) {
    if (stack_marker[i] != static_cast<char>(id + i)) p.trace.push_back(-1);
  }
  double want = 1.0 + id;
  for (int round = 0; round < p.rounds; ++round) want = want * 1.5 + std::sqrt(double(round));
  p.trace.push_back(accumulator == want ? 9000 + id : -2);
  FiberContext::Switch(p.fibers[id], p.main);
}

class FiberContextTest : public ::testing::TestWithParam<ContextKind> {};

TEST_P(FiberContextTest, PingPongKeepsOrderAndState) {
  FiberStacks stacks(64 * 1024);
  stacks.Reserve(2);
  PingPong p;
  p.rounds = 3;
  current = &p;
  for (int id = 0; id < 2; ++id) {
    p.fibers[id].Prepare(GetParam(), stacks.stack(id), stacks.stack_bytes(), &FiberBody,
                         reinterpret_cast<void*>(static_cast<intptr_t>(id)));
  }
  // main -> fiber 0 -> fiber 1 -> main, three times; then each fiber finishes.
  for (int round = 0; round < p.rounds; ++round) FiberContext::Switch(p.main, p.fibers[0]);
  FiberContext::Switch(p.main, p.fibers[0]);  // fiber 0 checks its state and returns to main
  FiberContext::Switch(p.main, p.fibers[1]);
  const std::vector<int> want = {0, 1000, 1, 1001, 2, 1002, 9000, 9001};
  EXPECT_EQ(p.trace, want);
}

TEST_P(FiberContextTest, StacksAreDistinctAndReused) {
  FiberStacks stacks(20 * 1024);
  stacks.Reserve(3);
  void* first = stacks.stack(0);
  stacks.Reserve(10);
  EXPECT_EQ(stacks.stack(0), first) << "growing keeps existing stacks in place";
  for (int i = 1; i < 10; ++i) {
    const auto distance = static_cast<char*>(stacks.stack(i)) - static_cast<char*>(stacks.stack(0));
    EXPECT_NE(distance, 0);
  }
  EXPECT_GE(stacks.stack_bytes(), 20u * 1024);
}

std::vector<ContextKind> Kinds() {
  std::vector<ContextKind> kinds = {ContextKind::kUcontext};
  if (AssemblyContextAvailable()) kinds.push_back(ContextKind::kAssembly);
  return kinds;
}

INSTANTIATE_TEST_SUITE_P(Kinds, FiberContextTest, ::testing::ValuesIn(Kinds()),
                         [](const auto& info) {
                           return info.param == ContextKind::kAssembly ? "Assembly" : "Ucontext";
                         });

TEST(FiberStacksTest, GuardPageStopsAnOverflow) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        FiberStacks stacks(16 * 1024);
        stacks.Reserve(2);
        // Writing just below stack 1 hits its guard page.
        static_cast<volatile char*>(stacks.stack(1))[-1] = 1;
      },
      "");
}

}  // namespace
}  // namespace dcf::simt::detail
