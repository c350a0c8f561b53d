#include "engine/serving/request_stream.h"

#include <utility>

namespace dcf {
namespace {

// Roughly what `chunk` costs on the wire: an id and a logprob per token and per alternative,
// plus the text.
size_t ApproxBytes(const GenerationChunk& chunk) {
  size_t n = chunk.text.size();
  for (const TokenOutput& t : chunk.tokens) n += 16 + 12 * t.top.size();
  return n;
}

// Appends `src` to `dst` (both chunks of the same request, `src` later).
void Merge(GenerationChunk&& src, GenerationChunk* dst) {
  for (auto& t : src.tokens) dst->tokens.push_back(std::move(t));
  dst->text += src.text;
  if (src.finished) {
    dst->finished = true;
    dst->finish_reason = src.finish_reason;
    dst->error = std::move(src.error);
    dst->usage = src.usage;
    dst->timing = src.timing;
  }
}

}  // namespace

bool RequestStream::TryTake(GenerationChunk* out) {
  absl::MutexLock lock(&mu_);
  if (!has_pending_) return false;
  *out = std::move(pending_);
  pending_ = GenerationChunk();
  has_pending_ = false;
  pending_bytes_ = 0;
  if (out->finished) final_taken_ = true;
  return true;
}

bool RequestStream::WaitTake(GenerationChunk* out, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(absl::Condition(&has_pending_), timeout)) return false;
  *out = std::move(pending_);
  pending_ = GenerationChunk();
  has_pending_ = false;
  pending_bytes_ = 0;
  if (out->finished) final_taken_ = true;
  return true;
}

void RequestStream::SetOnReady(std::function<void()> on_ready) {
  bool run_now = false;
  {
    absl::MutexLock lock(&mu_);
    on_ready_ = on_ready;
    run_now = has_pending_ && on_ready_ != nullptr;
  }
  if (run_now) on_ready();
}

size_t RequestStream::pending_bytes() const {
  absl::MutexLock lock(&mu_);
  return pending_bytes_;
}

bool RequestStream::done() const {
  absl::MutexLock lock(&mu_);
  return final_taken_;
}

void RequestStream::Push(GenerationChunk chunk) {
  std::function<void()> callback;
  {
    absl::MutexLock lock(&mu_);
    pending_bytes_ += ApproxBytes(chunk);
    Merge(std::move(chunk), &pending_);
    has_pending_ = true;
    callback = on_ready_;
  }
  if (callback) callback();
}

}  // namespace dcf
