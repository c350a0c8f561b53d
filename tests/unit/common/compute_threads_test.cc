#include "engine/common/compute_threads.h"

#include <dirent.h>
#include <omp.h>
#include <unistd.h>

#include <atomic>

#include "gtest/gtest.h"

namespace dcf {
namespace {

// Threads of this process (/proc/self/task).
int ProcessThreads() {
  DIR* d = opendir("/proc/self/task");
  int n = 0;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

// ProcessThreads() once it equals `want`, or after 2 s (an ended thread leaves the list a
// moment after its team released it).
int ThreadsOnceThey(int want) {
  int n = ProcessThreads();
  for (int i = 0; i < 200 && n != want; ++i) {
    usleep(10000);
    n = ProcessThreads();
  }
  return n;
}

// A parallel region of `threads` leaves its workers behind; ReleaseIdleComputeThreads ends
// them (Engine::Create relies on it so that the loading thread's workers never spin beside
// the loop's), and the next region starts them again.
TEST(ComputeThreadsTest, ReleaseEndsTheCallersIdleWorkers) {
  constexpr int kThreads = 3;
  const auto region = [] {
    std::atomic<int> ran{0};
#pragma omp parallel num_threads(kThreads)
    ran.fetch_add(1);
    return ran.load();
  };
  ASSERT_EQ(region(), kThreads);
  const int with_workers = ProcessThreads();
  ReleaseIdleComputeThreads();
  EXPECT_EQ(ThreadsOnceThey(with_workers - (kThreads - 1)), with_workers - (kThreads - 1));
  ASSERT_EQ(region(), kThreads);
  EXPECT_EQ(ProcessThreads(), with_workers);
  // Inside a region it does nothing (the team is in use).
#pragma omp parallel num_threads(kThreads)
  {
#pragma omp master
    ReleaseIdleComputeThreads();
  }
  EXPECT_EQ(ProcessThreads(), with_workers);
}

}  // namespace
}  // namespace dcf
