#include "server/stream_writer_pool.h"

#include <algorithm>
#include <utility>

namespace dcf::server {

StreamWriterPool::StreamWriterPool(int num_threads) {
  for (int i = 0; i < std::max(1, num_threads); ++i) threads_.emplace_back([this] { Run(); });
}

StreamWriterPool::~StreamWriterPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void StreamWriterPool::Post(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return;
  tasks_.push_back(std::move(task));
}

void StreamWriterPool::Run() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !tasks_.empty() || stopping_;
      };
      mu_.Await(absl::Condition(&ready));
      if (tasks_.empty()) return;  // stopping, and everything posted before has run
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace dcf::server
