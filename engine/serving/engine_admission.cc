// Admission: a request validated and its state built (Prepare), then a group admitted to the
// waiting queue under one lock, or refused whole (EnqueueAll); cancels queued for the loop.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/kv/block_hash.h"
#include "engine/serving/engine_impl.h"

namespace dcf {

using engine_internal::EngineImpl;

namespace {

// OutOfRange when one prompt of `len` tokens alone exceeds the waiting queue's token limit.
absl::Status CheckPromptQueueable(const EngineOptions& o, int64_t len) {
  // Waits in the queue could never admit it: not "full, retry later" but "cannot succeed".
  if (len <= o.max_queued_prompt_tokens) return absl::OkStatus();
  return absl::OutOfRangeError(absl::StrCat(
      "prompt_tokens: ", len, " tokens exceed the waiting queue's limit of ",
      o.max_queued_prompt_tokens,
      " prompt tokens (max_queued_prompt_tokens): this prompt can never be queued"));
}

// OutOfRange when `count` requests of `tokens` prompt tokens in all, each within the limits
// alone, exceed the waiting queue's limits together.
absl::Status CheckGroupQueueable(const EngineOptions& o, int64_t count, int64_t tokens) {
  if (count > o.max_queued_requests) {
    return absl::OutOfRangeError(absl::StrCat(
        "requests: ", count, " requests exceed the waiting queue's limit of ",
        o.max_queued_requests,
        " requests (max_queued_requests): they can never be queued together"));
  }
  if (tokens > o.max_queued_prompt_tokens) {
    return absl::OutOfRangeError(absl::StrCat(
        "requests: ", count, " requests of ", tokens,
        " prompt tokens in all exceed the waiting queue's limit of ",
        o.max_queued_prompt_tokens,
        " prompt tokens (max_queued_prompt_tokens): they can never be queued together"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status EngineImpl::CheckQueueable(absl::Span<const GenerationRequest> requests,
                                        int* failed) const {
  if (failed != nullptr) *failed = -1;
  int64_t tokens = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const int64_t len = static_cast<int64_t>(requests[i].prompt_tokens.size());
    if (absl::Status s = CheckPromptQueueable(options_, len); !s.ok()) {
      if (failed != nullptr) *failed = static_cast<int>(i);
      return s;
    }
    tokens += len;
  }
  return CheckGroupQueueable(options_, static_cast<int64_t>(requests.size()), tokens);
}

absl::StatusOr<std::unique_ptr<engine_internal::ActiveRequest>> EngineImpl::Prepare(
    GenerationRequest request) const {
  RETURN_IF_ERROR(ValidateRequest(request, limits_));
  const int prompt_len = static_cast<int>(request.prompt_tokens.size());
  const int max_len = prompt_len + request.stopping.max_new_tokens;
  if (!FitsPoolAlone(kv_shape_, max_len)) {
    return absl::OutOfRangeError(
        absl::StrCat("prompt + max_new_tokens = ", max_len,
                     " tokens can never fit the KV cache pool (",
                     kv_shape_.num_blocks[0], " global blocks of ", kv_shape_.block_size,
                     " tokens); lower max_new_tokens or give the engine more KV memory"));
  }
  auto r = std::make_unique<ActiveRequest>();
  r->enqueue_time = absl::Now();
  r->seed = request.sampling.seed.has_value() ? *request.sampling.seed
                                               : absl::Uniform<uint64_t>(absl::BitGen());
  r->output = std::make_unique<OutputProcessor>(request.stopping, request.output,
                                                limits_.eos_token_id,
                                                tokenizer_, prompt_len, config_.max_positions);
  if (options_.spec_tokens > 0 && request.speculate) {
    r->proposer = std::make_unique<NgramProposer>(
        NgramOptions{options_.spec_ngram_min, options_.spec_ngram_max});
    r->spec_k = options_.spec_tokens;
  }
  r->seq.tokens = request.prompt_tokens;
  r->seq.kv.hash_root = SaltRoot(request.cache_salt);
  r->seq.prompt_len = prompt_len;
  r->seq.max_len = max_len;
  r->request = std::move(request);
  return r;
}

absl::StatusOr<std::vector<std::shared_ptr<RequestStream>>> EngineImpl::EnqueueAll(
    std::vector<GenerationRequest> requests, int* failed) {
  int at = -1;
  if (failed == nullptr) failed = &at;
  *failed = -1;
  std::vector<std::unique_ptr<ActiveRequest>> group;
  group.reserve(requests.size());
  int64_t tokens = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    absl::StatusOr<std::unique_ptr<ActiveRequest>> r = Prepare(std::move(requests[i]));
    // Each request's own refusals in order, as Enqueue gives them: Prepare's, then its
    // prompt against the queue's token limit; the group's after all of them.
    absl::Status s = r.ok() ? CheckPromptQueueable(options_, (*r)->seq.prompt_len) : r.status();
    if (!s.ok()) {
      *failed = static_cast<int>(i);
      return s;
    }
    tokens += (*r)->seq.prompt_len;
    group.push_back(*std::move(r));
  }
  const int count = static_cast<int>(group.size());
  RETURN_IF_ERROR(CheckGroupQueueable(options_, count, tokens));
  std::vector<std::shared_ptr<RequestStream>> streams;
  streams.reserve(group.size());
  absl::MutexLock lock(&mu_);
  if (!stats_.healthy) {
    return absl::UnavailableError(
        absl::StrCat("the engine failed and accepts no requests: ", stats_.failure));
  }
  if (shutdown_ || !accepting_) {
    return absl::UnavailableError("the engine is not accepting requests (shutting down)");
  }
  // Room left, compared without a sum that could overflow (the counters never pass the
  // limits). The message gives what waits, the limit and what this call asked for.
  if (count > options_.max_queued_requests - queued_requests_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the waiting queue is full (", queued_requests_, " requests waiting, limit ",
        options_.max_queued_requests,
        count > 1 ? absl::StrCat("; this group needs room for ", count) : std::string(),
        "); retry later"));
  }
  if (tokens > options_.max_queued_prompt_tokens - queued_prompt_tokens_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the waiting queue is full (", queued_prompt_tokens_, " prompt tokens waiting, limit ",
        options_.max_queued_prompt_tokens, "; ", count > 1 ? "this group has " : "this one has ",
        tokens, "); retry later"));
  }
  for (std::unique_ptr<ActiveRequest>& r : group) {
    const uint64_t key = next_key_++;
    if (r->request.id.empty()) r->request.id = absl::StrCat("req-", key);
    live_keys_.insert(key);
    ++queued_requests_;
    queued_prompt_tokens_ += r->seq.prompt_len;
    // Visible at once, not only after the loop's next publish: a loop that hangs in the step
    // that takes this request must look busy to the server's stall watchdog.
    ++stats_.num_waiting;
    r->stream = std::make_shared<RequestStream>(r->request.id, key);
    streams.push_back(r->stream);
    inbox_.push_back(std::move(r));
  }
  return streams;
}

void EngineImpl::Cancel(uint64_t key) {
  absl::MutexLock lock(&mu_);
  if (live_keys_.contains(key)) cancels_.push_back(key);
}

}  // namespace dcf
