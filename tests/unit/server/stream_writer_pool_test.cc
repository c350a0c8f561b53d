#include "server/stream_writer_pool.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace dcf::server {
namespace {

TEST(StreamWriterPoolTest, RunsEveryPostedTaskFromManyThreads) {
  std::vector<int> seen(4000, 0);  // written by pool threads, read after the pool is gone
  {
    StreamWriterPool pool(2);
    std::vector<std::thread> posters;
    for (int p = 0; p < 4; ++p) {
      posters.emplace_back([&pool, &seen, p] {
        for (int i = 0; i < 1000; ++i) {
          const int k = p * 1000 + i;
          pool.Post([&seen, k] { seen[k] += 1; });
        }
      });
    }
    for (std::thread& t : posters) t.join();
  }  // the destructor runs what was posted, then joins
  for (int k = 0; k < 4000; ++k) ASSERT_EQ(seen[k], 1) << k;
}

TEST(StreamWriterPoolTest, TasksRunOffThePostingThread) {
  StreamWriterPool pool(1);
  absl::Notification ran;
  std::thread::id runner;
  pool.Post([&] {
    runner = std::this_thread::get_id();
    ran.Notify();
  });
  ran.WaitForNotification();
  EXPECT_NE(runner, std::this_thread::get_id());
}

}  // namespace
}  // namespace dcf::server
