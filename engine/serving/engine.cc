#include "engine/serving/engine.h"

#include <algorithm>
#include <optional>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "engine/common/compute_threads.h"
#include "engine/common/logging.h"
#include "engine/common/status_macros.h"
#include "engine/common/memory_info.h"
#include "engine/execution/step_plan.h"
#include "engine/serving/ngram_proposer.h"
#include "engine/serving/output_processor.h"
#include "engine/serving/engine_setup.h"
#include "engine/serving/request_validator.h"
#include "engine/serving/scheduler.h"
#include "engine/serving/step_pipeline.h"
#include "engine/tokenizer/tokenizer.h"

namespace dcf {
namespace engine_internal {

// Everything the engine keeps about one accepted request. Created by Enqueue (any thread),
// then owned and touched only by the engine loop.
struct ActiveRequest {
  GenerationRequest request;
  Sequence seq;
  std::shared_ptr<RequestStream> stream;
  uint64_t seed = 0;       // the request's random stream (its own, or drawn at Enqueue)
  int penalty_slot = -1;   // backend penalty state while running with penalties
  int cached_tokens = 0;   // prompt tokens the prefix cache held at its first admission
  std::unique_ptr<OutputProcessor> output;  // tokens -> chunks, stop rules, usage
  // Speculative decoding (null when off for this request): the drafter, the draft length
  // it may propose now, consecutive verifies that accepted nothing, and steps left before
  // it drafts again (the adaptive rule, SpecFeedback).
  std::unique_ptr<NgramProposer> proposer;
  int spec_k = 0;
  int spec_misses = 0;
  int spec_pause = 0;
  int spec_drafted = 0;   // Usage::draft_tokens
  int spec_accepted = 0;  // Usage::accepted_draft_tokens
  // Pipelined steps: the output slot of its newest pending token (Sequence::num_pending) in
  // the step that samples it, which the next step's chained token names.
  int32_t pending_slot = -1;
  absl::Time enqueue_time;
  std::optional<absl::Time> first_scheduled;
  std::optional<absl::Time> first_token;
  absl::Time last_token;
  bool in_queue_counters = true;  // counted in the waiting-queue limits
};

}  // namespace engine_internal

absl::StatusOr<PipelineSteps> ParsePipelineSteps(absl::string_view name) {
  for (PipelineSteps m : {PipelineSteps::kAuto, PipelineSteps::kOn, PipelineSteps::kOff}) {
    if (name == PipelineStepsName(m)) return m;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("pipeline steps '", name, "': expected auto, on or off"));
}

const char* PipelineStepsName(PipelineSteps mode) {
  switch (mode) {
    case PipelineSteps::kAuto:
      return "auto";
    case PipelineSteps::kOn:
      return "on";
    case PipelineSteps::kOff:
      return "off";
  }
  return "?";
}

namespace engine_internal {

class EngineImpl {
 public:
  using StepHook = Engine::StepHook;

  EngineImpl(std::unique_ptr<Backend> backend, const Tokenizer* tokenizer,
             const EngineOptions& options, EngineObserver* observer, const KvCacheShape& shape,
             const StepLimits& limits)
      : backend_(std::move(backend)),
        tokenizer_(tokenizer),
        options_(options),
        observer_(observer),
        config_(backend_->config()),
        kv_shape_(shape),
        kv_(shape, options.prefix_caching),
        scheduler_(SchedulerConfig{options.max_num_seqs, options.max_num_batched_tokens,
                                   options.max_prefill_chunk_tokens, options.watermark,
                                   options.spec_max_step_drafts, options.spec_step_tokens},
                   &kv_),
        pipeline_(options.pipeline_steps == PipelineSteps::kOn),
        blocks_per_seq_(limits.blocks_per_seq) {
    for (int slot = limits.num_penalty_slots - 1; slot >= 0; --slot) {
      free_penalty_slots_.push_back(slot);
    }
    limits_ = ResolveRequestLimits(config_.vocab_size, config_.max_positions,
                                   options.max_prompt_tokens, options.max_new_tokens_limit,
                                   options.default_max_new_tokens, tokenizer);
    for (int g = 0; g < kNumLayerGroups; ++g) {
      const LayerGroup group = static_cast<LayerGroup>(g);
      stats_.kv_blocks_total[g] = shape.num_blocks[g];
      if (config_.NumLayersIn(group) > 0) {
        stats_.kv_cache_bytes += backend_->BytesPerBlock(group, shape.block_size) *
                                 static_cast<size_t>(shape.num_blocks[g]);
      }
    }
    stats_.loop_alive = true;
    stats_.prefix_caching = options.prefix_caching;
    stats_.spec_tokens = options.spec_tokens;
    stats_.spec_step_tokens = options.spec_step_tokens;
    stats_.pipelining = pipeline_;
    stats_.backend = backend_->info();
    stats_.last_progress = absl::Now();
  }

  void Start() { thread_ = std::thread([this] { Loop(); }); }

  // Enqueue and EnqueueAll (engine.h): each request prepared (validated, its state built),
  // then the group admitted to the queue under one lock.
  absl::StatusOr<std::vector<std::shared_ptr<RequestStream>>> EnqueueAll(
      std::vector<GenerationRequest> requests, int* failed);
  absl::Status CheckQueueable(absl::Span<const GenerationRequest> requests, int* failed) const;
  absl::StatusOr<std::unique_ptr<ActiveRequest>> Prepare(GenerationRequest request) const;
  void Cancel(uint64_t key);
  void StopAccepting() {
    absl::MutexLock lock(&mu_);
    accepting_ = false;
  }
  void Shutdown();
  EngineStats Stats() const {
    absl::MutexLock lock(&mu_);
    return stats_;
  }
  void SetStepHook(StepHook hook) {
    absl::MutexLock lock(&mu_);
    step_hook_ = std::move(hook);
  }

  const ModelConfig& config() const { return config_; }
  const EngineOptions& options() const { return options_; }
  const RequestLimits& limits() const { return limits_; }

 private:
  bool HasInput() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !inbox_.empty() || !cancels_.empty() || shutdown_;
  }
  void Loop();
  // One step: planned, launched and, serially, waited for and its tokens processed; or,
  // pipelined, launched before the step in flight is waited for (then that one's tokens are
  // processed and this one is committed; it stays in flight).
  void Step();
  // Pipelined: a sequence that may draft this step runs serially (its proposer needs its
  // real last token).
  bool MayDraft() const;
  // Waits for the step in flight and processes its tokens. False when the backend failed
  // (FailBackend has ended every request).
  bool CompleteInFlight();
  bool Complete(const InFlightStep& step);
  // EngineObserver::OnStep for a step planned at `start` whose results were just processed,
  // with StepPipeline::StepTime (the times never overlap).
  void ReportStep(int num_seqs, int num_tokens, int num_prefill_tokens, absl::Time start);
  // After the pipelined Launch of `out`'s step (`slots`: its StepBatch::slot_offsets): the
  // pending tokens of its sampling chunks, then the results of the step before, then its
  // Commit, which therefore only ever covers known tokens.
  void Chain(const SchedulerOutput& out, std::vector<ActiveRequest*> owners,
             const std::vector<int32_t>& slots, absl::Time start);
  // Emits the tokens the backend sampled for `r` through its output processor: slots
  // [slot, slot + accepted] of out_ (`accepted` drafted tokens, then the one sampled after
  // them); finishes `r` when a stop rule holds. The drafts are already in r->seq.tokens.
  void ProcessTokens(ActiveRequest* r, int slot, int accepted);
  // Speculative decoding: sets seq.draft of every decoding sequence that drafts this step.
  void ProposeDrafts();
  // The adaptive rule, after a verify of `drafted` tokens accepted `accepted`.
  void SpecFeedback(ActiveRequest* r, int drafted, int accepted);
  // Gives `r` a penalty slot with its current tokens, when its sampling has penalties.
  absl::Status AcquirePenaltySlot(ActiveRequest* r);
  void ReleasePenaltySlot(ActiveRequest* r);
  // A step failed: the backend is treated as broken. Fails every request, stops accepting
  // new ones and reports the failure in Stats (health NOT_SERVING).
  void FailBackend(const absl::Status& status);
  // Ends `r`: frees its blocks, sets its final state and queues its final chunk (the output
  // processor's, with timing). `chunk` holds output not yet emitted (the last tokens).
  void Finish(ActiveRequest* r, FinishReason reason, absl::Status error,
              GenerationChunk chunk = GenerationChunk());
  void PublishAndFlush();

  // Fixed at construction.
  std::unique_ptr<Backend> backend_;
  const Tokenizer* tokenizer_;
  const EngineOptions options_;
  EngineObserver* observer_;
  const ModelConfig config_;
  const KvCacheShape kv_shape_;  // the pool's sizes: read by API threads (Enqueue)
  RequestLimits limits_;

  // Engine loop thread only.
  KvCacheManager kv_;
  Scheduler scheduler_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<ActiveRequest>> requests_;  // by stream key
  absl::flat_hash_map<const Sequence*, ActiveRequest*> by_seq_;  // live requests only
  std::vector<uint64_t> finished_keys_;  // to drop from live_keys_ at the next publish
  std::vector<std::pair<std::shared_ptr<RequestStream>, GenerationChunk>> outbox_;
  // Two batches: with pipelined steps one is in flight while the next is built (backend.h:
  // a batch stays unchanged until its Wait).
  std::array<StepBatch, 2> batches_;
  int next_batch_ = 0;
  StepOutput out_;
  const bool pipeline_;                // pipelined steps in effect
  StepPipeline step_pipeline_;         // the step in flight, its counters, the step times
  std::vector<int32_t> chunk_tokens_;  // a verify chunk's tokens while the batch is built
  const int blocks_per_seq_;
  std::vector<int> free_penalty_slots_;
  absl::Status failure_;  // set once a step failed
  int64_t next_seq_id_ = 0;
  int64_t steps_ = 0;
  int64_t tokens_generated_ = 0;
  int64_t spec_drafted_ = 0;
  int64_t spec_accepted_ = 0;
  int64_t prompt_tokens_computed_ = 0;
  int64_t prefix_cache_queries_ = 0;
  int64_t prefix_cache_hits_ = 0;
  int queue_dequeued_requests_ = 0;      // leaving the queue counters since the last publish
  int64_t queue_dequeued_tokens_ = 0;
  std::thread thread_;

  // Shared with the API threads.
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<ActiveRequest>> inbox_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> cancels_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> live_keys_ ABSL_GUARDED_BY(mu_);  // accepted, not finished
  bool accepting_ ABSL_GUARDED_BY(mu_) = true;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  int queued_requests_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t queued_prompt_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_key_ ABSL_GUARDED_BY(mu_) = 0;
  EngineStats stats_ ABSL_GUARDED_BY(mu_);
  StepHook step_hook_ ABSL_GUARDED_BY(mu_);

  absl::Mutex join_mu_;  // serializes Shutdown
};

}  // namespace engine_internal

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

void EngineImpl::Shutdown() {
  absl::MutexLock join_lock(&join_mu_);
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
    accepting_ = false;
  }
  if (thread_.joinable()) thread_.join();
}

void EngineImpl::Loop() {
  while (true) {
    std::vector<std::unique_ptr<ActiveRequest>> incoming;
    std::vector<uint64_t> cancels;
    bool stop = false;
    {
      absl::MutexLock lock(&mu_);
      // Idle: wake at least once a second so stats_.last_progress shows a live loop.
      if (!scheduler_.HasWork() && !step_pipeline_.has_in_flight()) {
        mu_.AwaitWithTimeout(absl::Condition(this, &EngineImpl::HasInput), absl::Seconds(1));
      }
      incoming.swap(inbox_);
      cancels.swap(cancels_);
      stop = shutdown_;
    }
    for (auto& r : incoming) {
      r->seq.seq_id = next_seq_id_++;
      scheduler_.Add(&r->seq);
      by_seq_[&r->seq] = r.get();
      const uint64_t key = r->stream->key();
      requests_[key] = std::move(r);
    }
    for (uint64_t key : cancels) {
      auto it = requests_.find(key);
      if (it != requests_.end() && !IsFinal(it->second->seq.state)) {
        Finish(it->second.get(), FinishReason::kCancelled, absl::OkStatus());
      }
    }
    if (stop) {
      // The step in flight first: its tokens are emitted, the backend is left idle.
      if (step_pipeline_.has_in_flight()) CompleteInFlight();
      for (auto& [id, r] : requests_) {
        if (!IsFinal(r->seq.state)) Finish(r.get(), FinishReason::kCancelled, absl::OkStatus());
      }
    } else if (scheduler_.HasWork() || step_pipeline_.has_in_flight()) {
      Step();
    }
    for (uint64_t key : finished_keys_) requests_.erase(key);
    PublishAndFlush();
    if (stop) break;
  }
  absl::MutexLock lock(&mu_);
  stats_.loop_alive = false;
}

void EngineImpl::ProposeDrafts() {
  // Every running sequence the step schedules adds a token: with as many running as the step
  // token budget (options_.spec_step_tokens) no draft fits, so none is proposed.
  const int budget = options_.spec_step_tokens;
  const bool drafts_fit =
      budget == 0 || static_cast<int>(scheduler_.running().size()) < budget;
  for (Sequence* seq : scheduler_.running()) {
    seq->draft.clear();
    if (seq->state != RequestState::kDecode || seq->remaining() != 1) continue;
    ActiveRequest* r = by_seq_.at(seq);
    if (r->proposer == nullptr) continue;
    if (r->spec_pause > 0) {  // counts steps, drafts fitting or not
      --r->spec_pause;
      continue;
    }
    if (!drafts_fit) continue;
    // A verify of d drafts yields up to d + 1 tokens: never past max_len.
    const int room = seq->max_len - static_cast<int>(seq->tokens.size()) - 1;
    r->proposer->Propose(seq->tokens, std::min(r->spec_k, room), &seq->draft);
  }
}

void EngineImpl::SpecFeedback(ActiveRequest* r, int drafted, int accepted) {
  if (!options_.spec_adaptive) return;
  const int k = options_.spec_tokens;
  if (accepted == 0) {
    r->spec_k = std::max(1, r->spec_k / 2);
    // A sequence that keeps missing has nothing to copy for now: stop drafting for a while.
    if (++r->spec_misses >= 4) {
      r->spec_misses = 0;
      r->spec_pause = 32;
    }
    return;
  }
  r->spec_misses = 0;
  r->spec_k = accepted == drafted ? std::min(k, r->spec_k * 2) : std::max(1, accepted + 1);
}

bool EngineImpl::MayDraft() const {
  if (options_.spec_tokens == 0) return false;
  for (const Sequence* seq : scheduler_.running()) {
    if (by_seq_.at(seq)->proposer != nullptr) return true;
  }
  return false;
}

void EngineImpl::Step() {
  const absl::Time t0 = absl::Now();
  // Pipelined unless a running sequence may draft; serially, the step in flight (if any)
  // completes first. It also does when nothing is left to plan (every request of it ended).
  const bool chain = pipeline_ && !MayDraft();
  if (step_pipeline_.has_in_flight() && (!chain || !scheduler_.HasWork())) {
    if (!CompleteInFlight() || !scheduler_.HasWork()) return;
  }
  if (options_.spec_tokens > 0) ProposeDrafts();
  SchedulerOutput out = scheduler_.Schedule();
  for (size_t i = 0; i < out.preempted.size(); ++i) {
    if (observer_ != nullptr) observer_->OnPreemption();
  }
  for (size_t i = 0; i < out.admitted.size(); ++i) {
    Sequence* s = out.admitted[i];
    ActiveRequest* r = by_seq_.at(s);
    if (options_.prefix_caching) {
      const int query = static_cast<int>(s->tokens.size());
      prefix_cache_queries_ += query;
      prefix_cache_hits_ += out.cached_tokens[i];
      if (observer_ != nullptr) observer_->OnPrefixCacheQuery(query, out.cached_tokens[i]);
    }
    if (!r->first_scheduled.has_value()) {
      r->first_scheduled = t0;
      r->cached_tokens = out.cached_tokens[i];
    }
    if (r->in_queue_counters) {
      r->in_queue_counters = false;
      ++queue_dequeued_requests_;
      queue_dequeued_tokens_ += r->seq.prompt_len;
    }
  }
  if (out.empty()) {
    // Pipelined: every running sequence waits for its last token (max_len) from the step in
    // flight, which ends it.
    if (step_pipeline_.has_in_flight()) {
      CompleteInFlight();
      return;
    }
    // Nothing running and the queue head cannot be admitted: it can never run (Enqueue
    // rejects such requests, so this is a safety net against a spinning loop).
    if (scheduler_.num_running() == 0 && scheduler_.num_waiting() > 0) {
      Finish(by_seq_.at(scheduler_.waiting().front()), FinishReason::kError,
             absl::ResourceExhaustedError("request does not fit the KV cache"));
    }
    return;
  }

  for (Sequence* seq : out.preempted) ReleasePenaltySlot(by_seq_.at(seq));
  for (Sequence* seq : out.admitted) {
    if (absl::Status st = AcquirePenaltySlot(by_seq_.at(seq)); !st.ok()) {
      FailBackend(st);
      return;
    }
  }

  std::vector<ActiveRequest*> owners;
  owners.reserve(out.chunks.size());
  StepBatch& batch = batches_[next_batch_];
  next_batch_ ^= 1;
  batch.Reset(blocks_per_seq_);
  for (const ScheduledChunk& c : out.chunks) {
    ActiveRequest* r = by_seq_.at(c.seq);
    owners.push_back(r);
    SamplingRow row;
    if (c.samples) {
      row.params = r->request.sampling;
      row.seed = r->seed;
      row.step = static_cast<uint64_t>(c.seq->num_generated());
      row.penalty_slot = r->penalty_slot;
      row.logprob = r->request.output.logprobs;
      row.top_logprobs = r->request.output.top_logprobs;
    }
    if (c.seq->num_pending > 0) {
      // Its last token is what the step in flight samples for it: chained to that slot.
      DCF_CHECK(chain && c.seq->num_pending == 1 && c.num_tokens == 1 && c.num_draft == 0 &&
                c.start + 1 == static_cast<int>(c.seq->tokens.size()))
          << "a pending token outside a pipelined decode chunk";
      chunk_tokens_.assign(1, ChainedToken(r->pending_slot));
      batch.AddSequence(chunk_tokens_, c.seq->kv, c.samples, row, /*return_logits=*/false);
    } else if (c.num_draft == 0) {
      batch.AddSequence(absl::MakeConstSpan(c.seq->tokens).subspan(c.start, c.num_tokens),
                        c.seq->kv, c.samples, row, /*return_logits=*/false);
    } else {  // the last known token, then the drafts it verifies
      chunk_tokens_.assign(1, c.seq->tokens[c.start]);
      chunk_tokens_.insert(chunk_tokens_.end(), c.seq->draft.begin(),
                           c.seq->draft.begin() + c.num_draft);
      batch.AddSequence(chunk_tokens_, c.seq->kv, c.samples, row, /*return_logits=*/false,
                        c.num_draft + 1);
    }
  }
  const absl::Status status = chain ? backend_->Launch(batch) : backend_->Step(batch, &out_);
  ++steps_;
  if (!status.ok()) {
    FailBackend(status);
    return;
  }
  const std::vector<int32_t> slots = batch.slot_offsets();
  if (chain) {
    Chain(out, std::move(owners), slots, t0);
    return;
  }
  // Verify: the accepted drafts join the sequence's tokens before Commit (which names the
  // blocks they complete); the rows of the rejected ones are simply not committed.
  std::vector<int> accepted(out.chunks.size(), 0);
  for (size_t i = 0; i < out.chunks.size(); ++i) {
    const ScheduledChunk& c = out.chunks[i];
    if (c.num_draft == 0) continue;
    accepted[i] = AcceptedDrafts(batch, static_cast<int>(i), out_, slots[i]);
    c.seq->tokens.insert(c.seq->tokens.end(), c.seq->draft.begin(),
                         c.seq->draft.begin() + accepted[i]);
    spec_drafted_ += c.num_draft;
    spec_accepted_ += accepted[i];
    owners[i]->spec_drafted += c.num_draft;
    owners[i]->spec_accepted += accepted[i];
    if (observer_ != nullptr) observer_->OnSpecVerify(c.num_draft, accepted[i]);
    SpecFeedback(owners[i], c.num_draft, accepted[i]);
  }
  scheduler_.Commit(out, accepted);
  prompt_tokens_computed_ += out.num_prefill_tokens;
  for (size_t i = 0; i < out.chunks.size(); ++i) {
    if (out.chunks[i].samples) ProcessTokens(owners[i], slots[i], accepted[i]);
  }
  ReportStep(static_cast<int>(out.chunks.size()), out.num_tokens, out.num_prefill_tokens, t0);
}

void EngineImpl::Chain(const SchedulerOutput& out, std::vector<ActiveRequest*> owners,
                       const std::vector<int32_t>& slots, absl::Time start) {
  for (size_t i = 0; i < out.chunks.size(); ++i) {
    if (out.chunks[i].samples) owners[i]->pending_slot = slots[i];
  }
  std::optional<InFlightStep> previous =
      step_pipeline_.Launched(out, std::move(owners), slots, start);
  // The step before fills the pending tokens this step's chunks end with (and may end some
  // of its requests, whose chunks are then dropped: Finish).
  if (previous.has_value() && !Complete(*previous)) return;
  scheduler_.Commit(step_pipeline_.LiveChunks(out));
  prompt_tokens_computed_ += out.num_prefill_tokens;
}

bool EngineImpl::CompleteInFlight() { return Complete(*step_pipeline_.Take()); }

bool EngineImpl::Complete(const InFlightStep& step) {
  if (absl::Status st = backend_->Wait(&out_); !st.ok()) {
    FailBackend(st);
    return false;
  }
  step_pipeline_.Completed(step);
  for (size_t i = 0; i < step.owners.size(); ++i) {
    if (step.owners[i] != nullptr && step.slots[i] >= 0) {
      ProcessTokens(step.owners[i], step.slots[i], 0);
    }
  }
  ReportStep(static_cast<int>(step.owners.size()), step.num_tokens_total, step.num_prefill_tokens,
             step.start);
  return true;
}

void EngineImpl::ReportStep(int num_seqs, int num_tokens, int num_prefill_tokens,
                            absl::Time start) {
  const absl::Duration step_time = step_pipeline_.StepTime(start, absl::Now());
  if (observer_ != nullptr) {
    observer_->OnStep(num_seqs, num_tokens, num_prefill_tokens, step_time);
  }
}

absl::Status EngineImpl::AcquirePenaltySlot(ActiveRequest* r) {
  if (!r->request.sampling.HasPenalties() || r->penalty_slot >= 0) return absl::OkStatus();
  // Every running sequence can hold one: there are as many slots as sequences per step.
  DCF_CHECK(!free_penalty_slots_.empty()) << "no free penalty slot";
  r->penalty_slot = free_penalty_slots_.back();
  free_penalty_slots_.pop_back();
  const Sequence& seq = r->seq;
  DCF_CHECK(seq.num_pending == 0) << "penalty state of a sequence with pending tokens";
  const absl::Span<const int32_t> tokens(seq.tokens);
  return backend_->SetPenaltyState(r->penalty_slot, tokens.subspan(0, seq.prompt_len),
                                   tokens.subspan(seq.prompt_len));
}

void EngineImpl::ReleasePenaltySlot(ActiveRequest* r) {
  if (r->penalty_slot < 0) return;
  free_penalty_slots_.push_back(r->penalty_slot);
  r->penalty_slot = -1;
}

void EngineImpl::FailBackend(const absl::Status& status) {
  DCF_LOG(Error) << "backend " << backend_->info().name << " failed; the engine stops serving: "
                 << status;
  failure_ = status;
  // A step in flight is lost with the backend: never waited for.
  step_pipeline_.Abandon();
  {
    absl::MutexLock lock(&mu_);
    stats_.healthy = false;
    stats_.failure = std::string(status.message());
    accepting_ = false;
  }
  const absl::Status error = absl::InternalError(
      absl::StrCat("the model backend failed: ", status.message()));
  for (auto& [key, r] : requests_) {
    if (!IsFinal(r->seq.state)) Finish(r.get(), FinishReason::kError, error);
  }
}

void EngineImpl::ProcessTokens(ActiveRequest* r, int slot, int accepted) {
  const OutputOptions& o = r->request.output;
  // Slot slot + accepted is the token sampled after the drafts; a nonfinite one ends the
  // request after the drafts before it (which plain decoding emitted in earlier steps).
  const bool nonfinite = out_.nonfinite[slot + accepted] != 0;
  const int n = nonfinite ? accepted : accepted + 1;
  absl::InlinedVector<TokenOutput, 1> tokens(n);  // no allocation for a plain decode
  for (int j = 0; j < n; ++j) {
    TokenOutput& t = tokens[j];
    t.token = out_.tokens[slot + j];
    if (o.logprobs || o.top_logprobs > 0) {
      t.logprob = out_.logprobs[slot + j];
      for (int m = 0; m < o.top_logprobs; ++m) {
        const size_t k = static_cast<size_t>(slot + j) * kMaxTopLogprobs + m;
        if (out_.top_tokens[k] < 0) break;  // fewer ids than asked (tiny vocabularies)
        t.top.push_back({out_.top_tokens[k], out_.top_logprobs[k]});
      }
    }
  }
  GenerationChunk chunk;
  OutputProcessor::Update u;
  if (n > 0) u = r->output->Process(tokens, &chunk);
  Sequence& seq = r->seq;
  if (seq.num_pending > 0) {
    // Pipelined (never with drafts): the token takes the place its step's launch left, the
    // oldest pending one. Not taken, the request ends (Finish drops the placeholders).
    DCF_CHECK(accepted == 0) << "a pipelined step verified drafts";
    if (u.accepted > 0) {
      seq.tokens[seq.tokens.size() - seq.num_pending] = tokens[0].token;
      --seq.num_pending;
    }
  } else {
    // The drafts are in seq.tokens already; what the processor cut goes again (the request
    // ends then), and the last sampled token joins.
    const size_t before = seq.tokens.size() - accepted;
    seq.tokens.resize(before + std::min(u.accepted, accepted));
    if (u.accepted > accepted) seq.tokens.push_back(tokens[accepted].token);
  }
  tokens_generated_ += u.accepted;
  if (u.reason == FinishReason::kUnspecified && nonfinite) {
    if (observer_ != nullptr) observer_->OnNonFiniteLogits();
    if (!chunk.tokens.empty()) outbox_.emplace_back(r->stream, std::move(chunk));
    Finish(r, FinishReason::kError,
           absl::InternalError(absl::StrCat(
               "the model's logits for this request are not finite (NaN or infinity) at "
               "position ", r->seq.tokens.size() - r->seq.num_pending - 1,
               ", so no token was sampled: its weights may be corrupt (--check-weights scans "
               "them at load) or its activations overflowed")));
    return;
  }
  const absl::Time now = absl::Now();
  if (!r->first_token.has_value()) {
    r->first_token = now;
    if (observer_ != nullptr) observer_->OnFirstToken(r->request.origin, now - r->enqueue_time);
  } else if (observer_ != nullptr) {
    // A verify step emits its accepted run at once: each of its tokens counts the run's
    // share of the time since the last one, so the histogram stays per token (a plain step:
    // one observation, as before).
    const int count = std::max(1, u.accepted);
    const absl::Duration per_token = (now - r->last_token) / count;
    for (int j = 0; j < count; ++j) {
      observer_->OnInterTokenLatency(r->request.origin, per_token);
    }
  }
  r->last_token = now;
  if (u.reason != FinishReason::kUnspecified) {
    Finish(r, u.reason, u.error, std::move(chunk));
  } else {
    outbox_.emplace_back(r->stream, std::move(chunk));
  }
}

void EngineImpl::Finish(ActiveRequest* r, FinishReason reason, absl::Status error,
                        GenerationChunk chunk) {
  r->output->Finish(reason, std::move(error), &chunk);
  chunk.usage.cached_tokens = r->cached_tokens;
  chunk.usage.draft_tokens = r->spec_drafted;
  chunk.usage.accepted_draft_tokens = r->spec_accepted;
  scheduler_.Remove(&r->seq);
  ReleasePenaltySlot(r);
  // Pipelined: its chunk in the step in flight is computed for nothing (its blocks may be
  // reused at once: every later step runs after it, on the device too), and its pending
  // tokens will never be known.
  step_pipeline_.Drop(r);
  r->seq.tokens.resize(r->seq.tokens.size() - r->seq.num_pending);
  r->seq.num_pending = 0;
  const RequestState to = reason == FinishReason::kCancelled ? RequestState::kCancelled
                          : reason == FinishReason::kError   ? RequestState::kFailed
                                                             : RequestState::kFinished;
  SetState(r->seq, to);
  if (r->in_queue_counters) {
    r->in_queue_counters = false;
    ++queue_dequeued_requests_;
    queue_dequeued_tokens_ += r->seq.prompt_len;
  }
  const absl::Time now = absl::Now();
  chunk.timing.queue_time = r->first_scheduled.value_or(now) - r->enqueue_time;
  chunk.timing.time_to_first_token =
      r->first_token.has_value() ? *r->first_token - r->enqueue_time : absl::ZeroDuration();
  chunk.timing.total = now - r->enqueue_time;
  if (observer_ != nullptr) observer_->OnFinished(r->request.origin, chunk);
  outbox_.emplace_back(r->stream, std::move(chunk));
  finished_keys_.push_back(r->stream->key());
  by_seq_.erase(&r->seq);
}

void EngineImpl::PublishAndFlush() {
  StepHook hook;
  {
    absl::MutexLock lock(&mu_);
    for (uint64_t key : finished_keys_) live_keys_.erase(key);
    queued_requests_ -= queue_dequeued_requests_;
    queued_prompt_tokens_ -= queue_dequeued_tokens_;
    stats_.num_waiting = scheduler_.num_waiting() + static_cast<int>(inbox_.size());
    stats_.num_running = scheduler_.num_running();
    stats_.num_preemptions = scheduler_.num_preemptions();
    stats_.steps = steps_;
    for (int g = 0; g < kNumLayerGroups; ++g) {
      const LayerGroup group = static_cast<LayerGroup>(g);
      stats_.kv_blocks_used[g] = kv_.num_used(group);
      stats_.kv_blocks_cached[g] = kv_.num_cached(group);
      stats_.prefix_cache_evictions[g] = kv_.num_evictions(group);
    }
    stats_.prefix_cache_queries = prefix_cache_queries_;
    stats_.prefix_cache_hits = prefix_cache_hits_;
    stats_.last_progress = absl::Now();
    stats_.tokens_generated = tokens_generated_;
    stats_.spec_drafted_tokens = spec_drafted_;
    stats_.spec_accepted_tokens = spec_accepted_;
    stats_.prompt_tokens_computed = prompt_tokens_computed_;
    stats_.chained_steps = step_pipeline_.chained_steps();
    stats_.pipeline_dropped_tokens = step_pipeline_.dropped_tokens();
    hook = step_hook_;
  }
  finished_keys_.clear();
  queue_dequeued_requests_ = 0;
  queue_dequeued_tokens_ = 0;
  if (hook) {
    std::vector<const Sequence*> running(scheduler_.running().begin(),
                                         scheduler_.running().end());
    hook(kv_, running);
  }
  // Streams last, so a consumer that sees its final chunk also sees the stats above.
  for (auto& [stream, chunk] : outbox_) stream->Push(std::move(chunk));
  outbox_.clear();
}

// --- Engine ---

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::unique_ptr<Backend> backend,
                                                       const Tokenizer* tokenizer,
                                                       const EngineOptions& options,
                                                       EngineObserver* observer) {
  if (backend == nullptr) return absl::InvalidArgumentError("backend is null");
  RETURN_IF_ERROR(engine_internal::ValidateEngineOptions(options));
  std::string step_tokens_source;
  const EngineOptions resolved =
      engine_internal::ResolveEngineOptions(options, *backend, &step_tokens_source);
  const StepLimits limits = engine_internal::EngineStepLimits(resolved, backend->config());
  ASSIGN_OR_RETURN(const size_t available, backend->Prepare(limits));
  ASSIGN_OR_RETURN(const KvCacheShape shape,
                   engine_internal::PlanEngineKvCache(options, *backend, limits, available));
  RETURN_IF_ERROR(backend->AllocateCache(shape));
  const BackendInfo info = backend->info();
  auto impl = std::make_shared<EngineImpl>(std::move(backend), tokenizer, resolved, observer,
                                           shape, limits);
  DCF_LOG(Info) << "backend " << info.name << " on " << info.device << ", "
                << WeightsName(info) << " weights; KV cache "
                << (impl->Stats().kv_cache_bytes >> 20) << " MiB of " << (available >> 20)
                << " MiB available: " << shape.num_blocks[0] << " global + "
                << shape.num_blocks[1] << " window blocks of " << shape.block_size
                << " tokens; prefix caching " << (options.prefix_caching ? "on" : "off")
                << "; speculative decoding "
                << (resolved.spec_tokens > 0
                        ? absl::StrCat(resolved.spec_tokens, " tokens, drafts while a step holds "
                                       "at most ",
                                       resolved.spec_step_tokens > 0
                                           ? absl::StrCat(resolved.spec_step_tokens)
                                           : std::string("any number of"),
                                       " tokens (", step_tokens_source, ")")
                        : std::string("off"))
                << "; pipelined steps " << PipelineStepsName(resolved.pipeline_steps);
  // The loop thread runs every step with its own OpenMP team: the workers this thread started
  // (packing the weights, the measurement above) would only wait, or spin with
  // OMP_WAIT_POLICY=active on the cores the steps need.
  ReleaseIdleComputeThreads();
  impl->Start();
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::Engine(std::shared_ptr<EngineImpl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() { Shutdown(); }

absl::StatusOr<RequestHandle> Engine::Enqueue(GenerationRequest request) {
  std::vector<GenerationRequest> one;
  one.push_back(std::move(request));
  ASSIGN_OR_RETURN(std::vector<RequestHandle> handles, EnqueueAll(std::move(one)));
  return std::move(handles[0]);
}
absl::StatusOr<std::vector<RequestHandle>> Engine::EnqueueAll(
    std::vector<GenerationRequest> requests, int* failed) {
  ASSIGN_OR_RETURN(std::vector<std::shared_ptr<RequestStream>> streams,
                   impl_->EnqueueAll(std::move(requests), failed));
  std::vector<RequestHandle> handles;
  handles.reserve(streams.size());
  for (std::shared_ptr<RequestStream>& s : streams) {
    handles.push_back(RequestHandle(impl_, std::move(s)));
  }
  return handles;
}
absl::Status Engine::CheckQueueable(absl::Span<const GenerationRequest> requests,
                                    int* failed) const {
  return impl_->CheckQueueable(requests, failed);
}
void Engine::Cancel(uint64_t request_key) { impl_->Cancel(request_key); }
void Engine::StopAccepting() { impl_->StopAccepting(); }
void Engine::Shutdown() { impl_->Shutdown(); }
EngineStats Engine::Stats() const { return impl_->Stats(); }
const ModelConfig& Engine::config() const { return impl_->config(); }
const EngineOptions& Engine::options() const { return impl_->options(); }
const RequestLimits& Engine::limits() const { return impl_->limits(); }
void Engine::SetStepHookForTesting(StepHook hook) { impl_->SetStepHook(std::move(hook)); }

// --- RequestHandle ---

RequestHandle& RequestHandle::operator=(RequestHandle&& other) {
  if (this != &other) {
    Cancel();
    engine_ = std::move(other.engine_);
    stream_ = std::move(other.stream_);
  }
  return *this;
}

RequestHandle::~RequestHandle() { Cancel(); }

void RequestHandle::Cancel() { canceller().Cancel(); }

void RequestCanceller::Cancel() const {
  const std::shared_ptr<RequestStream> stream = stream_.lock();
  if (stream == nullptr || stream->done()) return;
  if (std::shared_ptr<EngineImpl> engine = engine_.lock()) engine->Cancel(stream->key());
}

}  // namespace dcf
