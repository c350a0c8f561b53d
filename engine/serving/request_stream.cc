#include "engine/serving/request_stream.h"

#include <utility>

namespace dcf {
namespace {

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
  if (out->finished) final_taken_ = true;
  return true;
}

bool RequestStream::WaitTake(GenerationChunk* out, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(absl::Condition(&has_pending_), timeout)) return false;
  *out = std::move(pending_);
  pending_ = GenerationChunk();
  has_pending_ = false;
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

bool RequestStream::done() const {
  absl::MutexLock lock(&mu_);
  return final_taken_;
}

void RequestStream::Push(GenerationChunk chunk) {
  std::function<void()> callback;
  {
    absl::MutexLock lock(&mu_);
    Merge(std::move(chunk), &pending_);
    has_pending_ = true;
    callback = on_ready_;
  }
  if (callback) callback();
}

}  // namespace dcf
