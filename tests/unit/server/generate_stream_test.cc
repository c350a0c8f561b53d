// GenerateStream against a real engine (the small golden model on the CPU backend) and a fake
// RPC that behaves like gRPC's callback API: reactions on their own threads, a failed write
// and OnCancel once the call is cancelled, OnDone only after the finish and every other
// reaction. Many calls at once whose clients read, never read, read slowly or cancel, with the
// write-stall watchdog running: scripts/sanitizers.sh runs this under ThreadSanitizer, which
// then checks the stream's locking against every thread that reaches it (engine loop, writer
// pool, RPC threads, watchdog).
#include "server/generate_stream.h"

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "engine/backends/backend_factory.h"
#include "engine/common/logging.h"
#include "engine/serving/engine.h"
#include "gtest/gtest.h"
#include "server/metrics.h"
#include "server/serving_state.h"
#include "server/wire.h"
#include "tests/testing/golden.h"

namespace dcf::server {
namespace {

// Threads that run the fake RPC's reactions, in FIFO order per thread.
class Reactions {
 public:
  explicit Reactions(int n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this] { Run(); });
  }
  ~Reactions() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    for (std::thread& t : threads_) t.join();
  }
  void Post(std::function<void()> task) {
    absl::MutexLock lock(&mu_);
    tasks_.push_back(std::move(task));
  }

 private:
  void Run() {
    while (true) {
      std::function<void()> task;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return !tasks_.empty() || stopping_;
        };
        mu_.Await(absl::Condition(&ready));
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      std::this_thread::yield();
      task();
    }
  }
  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

enum class Client { kReads, kNeverReads, kCancels };

// One call as gRPC would run it. Kept alive (shared) until the test ends, as gRPC keeps a
// cancelled call's core object alive while a reference on it exists.
class FakeCall : public GenerateStream::Rpc, public std::enable_shared_from_this<FakeCall> {
 public:
  FakeCall(Reactions* reactions, Client client, int port)
      : reactions_(reactions), client_(client), peer_("ipv4:127.0.0.1:" + std::to_string(port)) {}

  void Start(ServingState* state, const grpc::ByteBuffer& request) {
    {
      absl::MutexLock lock(&mu_);
      stream_ = std::make_unique<GenerateStream>(state, this);
      ++running_;  // the method handler, as gRPC counts it
    }
    stream_->Start(request);
    absl::MutexLock lock(&mu_);
    --running_;
    MaybeDoneLocked();
  }

  // The client cancels (or its connection breaks).
  void ClientCancel() { Cancel(); }

  const std::multimap<grpc::string_ref, grpc::string_ref>& client_metadata() const override {
    return metadata_;
  }
  std::string peer() const override { return peer_; }
  absl::Time deadline() const override { return absl::InfiniteFuture(); }
  bool IsCancelled() const override {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }

  void StartWrite(const grpc::ByteBuffer* message) override {
    absl::MutexLock lock(&mu_);
    if (write_pending_ || finished_) ++misuse_;  // two writes in flight, or after Finish
    write_pending_ = true;
    completion_posted_ = false;
    if (cancelled_ || client_ == Client::kReads) {
      completion_posted_ = true;
      ++running_;
      const bool ok = !cancelled_;
      if (ok) bytes_ += message->Length();
      reactions_->Post([self = shared_from_this(), ok] { self->WriteDone(ok); });
    }
    // kNeverReads: the write waits for a cancel.
  }

  void Finish(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    if (finished_ || write_pending_) ++misuse_;  // twice, or with a write in flight
    finished_ = true;
    status_ = status;
    MaybeDoneLocked();
  }

  std::function<void()> PrepareCancel(const grpc::Status& status) override {
    return [self = shared_from_this(), status] { self->Cancel(); };
  }

  // --- what the test checks once every call is done ---
  bool done() const {
    absl::MutexLock lock(&mu_);
    return done_;
  }
  grpc::Status status() const {
    absl::MutexLock lock(&mu_);
    return status_;
  }
  int misuse() const {
    absl::MutexLock lock(&mu_);
    return misuse_;
  }
  int violations() const {
    absl::MutexLock lock(&mu_);
    return violations_;
  }
  Client client() const { return client_; }

 private:
  void Cancel() {
    absl::MutexLock lock(&mu_);
    if (cancelled_ || done_) return;
    cancelled_ = true;
    if (write_pending_ && !completion_posted_) {  // a write waiting for a client's window
      completion_posted_ = true;
      ++running_;
      reactions_->Post([self = shared_from_this()] { self->WriteDone(false); });
    }
    ++running_;
    reactions_->Post([self = shared_from_this()] {
      self->stream_->OnCancel();
      absl::MutexLock lock(&self->mu_);
      --self->running_;
      self->MaybeDoneLocked();
    });
  }

  void WriteDone(bool ok) {
    {
      absl::MutexLock lock(&mu_);
      write_pending_ = false;
    }
    stream_->OnWriteDone(ok);
    absl::MutexLock lock(&mu_);
    --running_;
    MaybeDoneLocked();
  }

  // OnDone runs once the call finished, no write is in flight and no reaction runs.
  void MaybeDoneLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!finished_ || write_pending_ || running_ > 0 || done_scheduled_) return;
    done_scheduled_ = true;
    reactions_->Post([self = shared_from_this()] {
      const int violations = self->stream_->violations();
      self->stream_->OnDone();
      std::unique_ptr<GenerateStream> gone;
      absl::MutexLock lock(&self->mu_);
      self->violations_ = violations;
      gone = std::move(self->stream_);  // deleted as GenerateReactor deletes itself
      self->done_ = true;
    });
  }

  Reactions* const reactions_;
  const Client client_;
  const std::string peer_;
  const std::multimap<grpc::string_ref, grpc::string_ref> metadata_;
  mutable absl::Mutex mu_;
  std::unique_ptr<GenerateStream> stream_;
  bool write_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool completion_posted_ ABSL_GUARDED_BY(mu_) = false;  // the write's one completion
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool done_scheduled_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  int misuse_ ABSL_GUARDED_BY(mu_) = 0;
  int violations_ ABSL_GUARDED_BY(mu_) = 0;
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

TEST(GenerateStreamTest, ConcurrentCallsWithEveryKindOfClient) {
  SetMinLogLevel(LogLevel::kWarning);  // one line per call otherwise
  const std::string dir = testing::GoldenDir("dcformer-f32-short-prompt");
  absl::StatusOr<LoadedModel> model = LoadModel(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  EngineOptions engine_options;
  engine_options.kv_cache_bytes = 16'000'000;
  engine_options.max_queued_requests = 1024;
  ServerMetrics metrics;
  absl::StatusOr<std::unique_ptr<Engine>> engine =
      Engine::Create(std::move(model->backend), nullptr, engine_options, &metrics);
  ASSERT_TRUE(engine.ok()) << engine.status();

  ServerOptions options;
  options.model_dir = dir;
  // A client that never reads overflows the buffer (with logprobs) or its first write stalls
  // (without): both bounds race the engine, the client's cancel and the other events. The
  // first-write bound leaves a slow engine (an ASan build beside other tests) the time to run
  // a logprobs call past the buffer: with 1 s none did once, and nothing overflowed. (The
  // write-stall bound stays above it, so a first write that never completes ends by it.)
  options.max_stream_buffer_bytes = 4096;
  options.write_stall_timeout = absl::Seconds(10);
  options.first_write_timeout = absl::Seconds(5);
  options.max_open_streams = 0;
  options.max_open_streams_per_peer = 0;
  {
    ServingState state(&options, nullptr, &metrics);
    ServedModelInfo info;
    state.PublishEngine(engine->get(), (*engine)->limits(), info);

    absl::Notification stop;
    std::thread watchdog([&] {
      while (!stop.WaitForNotificationWithTimeout(absl::Milliseconds(1))) {
        state.EndStalledStreams(SteadyNowNanos());
      }
    });
    Reactions reactions(4);
    std::mt19937 rng(7);
    std::vector<std::shared_ptr<FakeCall>> calls;
    constexpr int kCalls = 240;
    for (int i = 0; i < kCalls; ++i) {
      const Client client = static_cast<Client>(rng() % 3);
      auto call = std::make_shared<FakeCall>(&reactions, client, 1000 + i);
      v1::GenerateRequest request;
      for (int t = 0; t < 4; ++t) request.mutable_token_ids()->add_ids(3 + (i + t) % 200);
      // At most 12 tokens of 256 bytes each (20 alternatives) for a reading client: they never
      // pass the buffer bound, however far the engine runs ahead of the writes; up to 40 for
      // the others, which then overflow it when they do not read.
      const int most = client == Client::kReads ? 12 : 40;
      request.mutable_stopping()->set_max_new_tokens(1 + static_cast<int>(rng() % most));
      request.mutable_stopping()->set_ignore_eos(true);
      request.mutable_output()->set_return_text(false);
      request.mutable_output()->set_top_logprobs(i % 2 == 0 ? 20 : 0);
      grpc::ByteBuffer bytes;
      SerializeToByteBuffer(request, &bytes);
      call->Start(&state, bytes);
      if (client == Client::kCancels) {
        // Some cancel at once, some later: from another thread, as a client's RST_STREAM.
        if (rng() % 2 == 0) {
          call->ClientCancel();
        } else {
          reactions.Post([call] { call->ClientCancel(); });
        }
      }
      calls.push_back(call);
    }
    for (const std::shared_ptr<FakeCall>& call : calls) {
      for (int spin = 0; !call->done(); ++spin) {
        ASSERT_LT(spin, 60'000) << "a call never ended";
        absl::SleepFor(absl::Milliseconds(1));  // polling the fake's state, not synchronisation
      }
    }
    stop.Notify();
    watchdog.join();
    int ok = 0, cancelled = 0, exhausted = 0, overflowed = 0, stalled = 0;
    for (const std::shared_ptr<FakeCall>& call : calls) {
      EXPECT_EQ(call->misuse(), 0);
      EXPECT_EQ(call->violations(), 0);
      const grpc::Status status = call->status();
      switch (call->client()) {
        case Client::kReads:
          EXPECT_TRUE(status.ok()) << status.error_message();
          break;
        case Client::kNeverReads:
          EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
          break;
        case Client::kCancels:
          // A call can finish before its client's cancel arrives.
          EXPECT_TRUE(status.ok() || status.error_code() == grpc::StatusCode::CANCELLED)
              << status.error_message();
          break;
      }
      ok += status.ok();
      cancelled += status.error_code() == grpc::StatusCode::CANCELLED;
      exhausted += status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
      overflowed += absl::StrContains(status.error_message(), "--max-stream-buffer-bytes");
      stalled += absl::StrContains(status.error_message(), "--first-write-timeout");
    }
    EXPECT_EQ(ok + cancelled + exhausted, kCalls);
    EXPECT_GT(cancelled, 0);
    EXPECT_GT(overflowed, 0);
    EXPECT_GT(stalled, 0);
    EXPECT_EQ(overflowed + stalled, exhausted);
    EXPECT_EQ(state.active_streams(), 0);
    // Every engine request was cancelled or finished: nothing holds a KV block.
    for (int spin = 0; (*engine)->Stats().num_running + (*engine)->Stats().num_waiting > 0;
         ++spin) {
      ASSERT_LT(spin, 60'000);
      absl::SleepFor(absl::Milliseconds(1));
    }
    const EngineStats stats = (*engine)->Stats();
    EXPECT_EQ(stats.kv_blocks_used[0] + stats.kv_blocks_used[1], 0);
    (*engine)->Shutdown();  // before the state: its callbacks post to the state's writer pool
  }
}

}  // namespace
}  // namespace dcf::server
