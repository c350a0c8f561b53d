#include "engine/simt/worker_pool.h"

namespace dcf::simt::detail {

WorkerPool& WorkerPool::Get() {
  static auto* pool = new WorkerPool();
  return *pool;
}

void WorkerPool::Run(int threads, const std::function<void()>& task) {
  if (threads <= 1) {
    task();
    return;
  }
  std::lock_guard<std::mutex> run_lock(run_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (static_cast<int>(helpers_.size()) < threads - 1) {
      const int index = static_cast<int>(helpers_.size());
      helpers_.emplace_back([this, index] { HelperMain(index); });
      helpers_.back().detach();
    }
    task_ = &task;
    task_helpers_ = threads - 1;
    running_ = threads - 1;
    ++generation_;
  }
  work_cv_.notify_all();
  task();
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return running_ == 0; });
  task_ = nullptr;
}

void WorkerPool::HelperMain(int index) {
  unsigned long seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return generation_ != seen; });
    seen = generation_;
    if (index >= task_helpers_) continue;
    const std::function<void()>* task = task_;
    lock.unlock();
    (*task)();
    lock.lock();
    if (--running_ == 0) done_cv_.notify_all();
  }
}

}  // namespace dcf::simt::detail
