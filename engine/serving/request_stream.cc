#include "engine/serving/request_stream.h"

#include <iterator>
#include <limits>
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

void RequestStream::TakeAllLocked(GenerationChunk* out) {
  *out = std::move(pending_);
  pending_ = GenerationChunk();
  has_pending_ = false;
  pending_bytes_ = 0;
  pieces_.clear();
  if (out->finished) final_taken_ = true;
}

bool RequestStream::TryTake(GenerationChunk* out) {
  return TryTake(out, std::numeric_limits<size_t>::max());
}

bool RequestStream::TryTake(GenerationChunk* out, size_t max_bytes) {
  absl::MutexLock lock(&mu_);
  if (!has_pending_) return false;
  size_t pieces = 0, tokens = 0, text_bytes = 0, bytes = 0;
  for (const Piece& p : pieces_) {
    if (pieces > 0 && bytes + p.bytes > max_bytes) break;
    ++pieces;
    tokens += p.tokens;
    text_bytes += p.text_bytes;
    bytes += p.bytes;
  }
  if (pieces == pieces_.size()) {
    TakeAllLocked(out);
    return true;
  }
  // A prefix of the pushes; the final chunk, if pushed, is in the rest.
  *out = GenerationChunk();
  auto first = pending_.tokens.begin();
  out->tokens.assign(std::make_move_iterator(first), std::make_move_iterator(first + tokens));
  pending_.tokens.erase(first, first + tokens);
  out->text = pending_.text.substr(0, text_bytes);
  pending_.text.erase(0, text_bytes);
  pieces_.erase(pieces_.begin(), pieces_.begin() + pieces);
  pending_bytes_ -= bytes;
  return true;
}

bool RequestStream::WaitTake(GenerationChunk* out, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(absl::Condition(&has_pending_), timeout)) return false;
  TakeAllLocked(out);
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
    const size_t bytes = ApproxBytes(chunk);
    pending_bytes_ += bytes;
    pieces_.push_back({static_cast<uint32_t>(chunk.tokens.size()),
                       static_cast<uint32_t>(chunk.text.size()), static_cast<uint32_t>(bytes)});
    Merge(std::move(chunk), &pending_);
    has_pending_ = true;
    callback = on_ready_;
  }
  if (callback) callback();
}

}  // namespace dcf
