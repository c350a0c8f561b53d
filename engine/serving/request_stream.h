// The consumer's side of one request: a thread-safe mailbox the engine loop fills with
// tokens and the final chunk, and that an RPC reactor (or a CLI, or a test) drains.
//
// Ownership: shared between the engine (producer) and the consumer. Destroying the
// consumer's last reference is NOT a cancel; call Cancel() (RequestHandle below does it on
// destruction).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/serving/request.h"

namespace dcf {

class Engine;

class RequestStream {
 public:
  // `id` is the client's request id (echoed and logged, not necessarily unique); `key` is
  // the engine's unique handle for this request.
  RequestStream(std::string id, uint64_t key) : id_(std::move(id)), key_(key) {}

  const std::string& id() const { return id_; }
  uint64_t key() const { return key_; }

  // --- consumer side (any thread) ---

  // Moves everything pending into `out` (tokens concatenated, text concatenated; when the
  // final chunk is pending it is merged in and `out->finished` is set). Returns false and
  // leaves `out` untouched when nothing is pending. Never blocks on the engine.
  bool TryTake(GenerationChunk* out);
  // The same, but stops after about `max_bytes` (pending_bytes() counts): whole pushes of the
  // engine in order, at least one, so that tokens and their text stay together. What is left
  // stays pending (the final chunk's fields come with the last push). A consumer that writes
  // each take as one message bounds its messages this way.
  bool TryTake(GenerationChunk* out, size_t max_bytes);

  // Blocks until something is pending (or `timeout` passes; returns false then) and takes it.
  bool WaitTake(GenerationChunk* out, absl::Duration timeout = absl::InfiniteDuration());

  // Installs a callback run (on the engine loop thread, without internal locks held) each
  // time new output becomes pending. It must be cheap and never block: it runs inside the
  // engine's step loop, so a server only hands the stream to its own threads there (see
  // server/stream_writer_pool.h). If output is already pending when installed, it is run
  // once immediately on this thread.
  void SetOnReady(std::function<void()> on_ready);

  // True once the final chunk has been taken.
  bool done() const;

  // Approximate serialized size of the output pending now (token ids, logprobs, text): what
  // a consumer that does not keep up lets pile up.
  size_t pending_bytes() const;

  // --- producer side (engine loop only) ---
  void Push(GenerationChunk chunk);

 private:
  void TakeAllLocked(GenerationChunk* out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string id_;
  const uint64_t key_;
  mutable absl::Mutex mu_;
  GenerationChunk pending_ ABSL_GUARDED_BY(mu_);
  bool has_pending_ ABSL_GUARDED_BY(mu_) = false;
  size_t pending_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Where each Push of `pending_` begins and ends, oldest first (what a bounded take splits at).
  struct Piece {
    uint32_t tokens;
    uint32_t text_bytes;
    uint32_t bytes;  // ApproxBytes
  };
  std::deque<Piece> pieces_ ABSL_GUARDED_BY(mu_);
  bool final_taken_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> on_ready_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dcf
