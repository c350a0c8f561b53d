// The engine behind Engine (engine.h): its loop thread, its queue and everything it keeps
// about the requests it accepted (ActiveRequest). Engine and RequestHandle hold it by a
// shared_ptr (a RequestCanceller by a weak_ptr), so a dropped handle can still cancel while
// the engine lives, and cancels nothing once it is gone.
//
// Private to engine/serving: engine.cc (Engine, RequestHandle), engine_admission.cc
// (validation and the waiting queue's admission: Prepare, CheckQueueable, EnqueueAll,
// Cancel) and engine_loop.cc (the loop: Loop, Step, pipelined steps, token processing,
// Finish, publishing) implement it; step_pipeline.h only names ActiveRequest. Nothing else
// includes it (scripts/check_layering.py: a *_impl.h header is private to its folder); the
// rest of the code, tests included, uses engine.h.
//
// Threads: the API threads call EnqueueAll, CheckQueueable, Prepare, Cancel, StopAccepting,
// Shutdown, Stats and SetStepHook, which touch only the members under mu_ (and the ones fixed
// at construction); everything else belongs to the engine loop thread (Start). Errors are
// absl::Status as Engine documents them.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "engine/execution/backend.h"
#include "engine/execution/step_batch.h"
#include "engine/kv/kv_cache_manager.h"
#include "engine/model/model_config.h"
#include "engine/serving/engine.h"
#include "engine/serving/ngram_proposer.h"
#include "engine/serving/output_processor.h"
#include "engine/serving/request.h"
#include "engine/serving/request_stream.h"
#include "engine/serving/request_validator.h"
#include "engine/serving/scheduler.h"
#include "engine/serving/sequence.h"
#include "engine/serving/step_pipeline.h"

namespace dcf::engine_internal {

// Everything the engine keeps about one accepted request. Created by Prepare (any thread),
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
  // One request of EnqueueAll validated and its state built (no lock held).
  absl::StatusOr<std::unique_ptr<ActiveRequest>> Prepare(GenerationRequest request) const;
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
  // Takes r out of the waiting queue's counters (once: at its first schedule, or when it
  // finishes without one); the next publish subtracts them under mu_.
  void LeaveQueueCounters(ActiveRequest* r);
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

}  // namespace dcf::engine_internal
