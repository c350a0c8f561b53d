// The threads that turn engine output into gRPC writes. The engine loop only marks a stream
// ready (RequestStream's on-ready callback posts a task here: a lock and a queue push); a
// writer thread then takes the stream's pending tokens, builds and serializes the response
// and starts the write. Later writes of a busy stream start from OnWriteDone on gRPC's own
// threads. So the loop's step time does not grow with the number of streams times the size of
// their responses (docs/DESIGN.md, "Data flow").
//
// Thread-safety: Post may be called from any thread. Tasks run on the pool's threads in FIFO
// order per thread; they must not block for long (they take a reactor's lock and call the
// non-blocking StartWrite/Finish).
// Lifetime: the destructor runs the tasks already posted, then joins the threads; tasks
// posted after it started are dropped. Destroy the pool only after the gRPC server and the
// engine (whose callbacks post here) are gone.
#pragma once

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace dcf::server {

class StreamWriterPool {
 public:
  explicit StreamWriterPool(int num_threads);
  ~StreamWriterPool();
  StreamWriterPool(const StreamWriterPool&) = delete;
  StreamWriterPool& operator=(const StreamWriterPool&) = delete;

  void Post(std::function<void()> task);

 private:
  void Run();

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace dcf::server
