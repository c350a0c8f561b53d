// The OS threads that run a grid's blocks when the SIMT emulator is set to use more than one
// (DCF_SIMT_THREADS / SetWorkerThreads). Helpers are started on first need and then wait for
// work; the thread that launches a grid always takes part itself.
//
// Thread-safe, but runs one task at a time: Run() calls are serialised.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dcf::simt::detail {

class WorkerPool {
 public:
  // The process-wide pool (never destroyed: helpers may still wait when the process exits).
  static WorkerPool& Get();

  // Runs `task` on `threads` OS threads at once, the caller being one of them, and returns
  // when every copy has returned.
  void Run(int threads, const std::function<void()>& task);

 private:
  WorkerPool() = default;
  void HelperMain(int index);

  std::mutex run_mu_;  // serialises Run()
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::vector<std::thread> helpers_;             // guarded by mu_
  const std::function<void()>* task_ = nullptr;  // guarded by mu_
  int task_helpers_ = 0;                         // helpers wanted for task_; guarded by mu_
  int running_ = 0;                              // helpers still in task_; guarded by mu_
  unsigned long generation_ = 0;                 // guarded by mu_
};

}  // namespace dcf::simt::detail
