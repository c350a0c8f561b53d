// The engine loop: one thread that takes in requests and cancels, plans each step, runs it
// (serially or pipelined), verifies drafts, turns sampled tokens into chunks, ends requests
// and publishes the stats and the chunks (docs/DESIGN.md).
#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "engine/common/logging.h"
#include "engine/execution/step_plan.h"
#include "engine/sampling/sampling_params.h"
#include "engine/serving/engine_impl.h"

namespace dcf {

using engine_internal::EngineImpl;

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
    LeaveQueueCounters(r);
  }
  // Before anything returns: a waiting sequence holds no penalty slot (AcquirePenaltySlot
  // sets the slot's state only for one that has none). A step can preempt and plan no chunk
  // (pipelined: the sequences left wait for their last token from the step in flight).
  for (Sequence* seq : out.preempted) ReleasePenaltySlot(by_seq_.at(seq));
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

void EngineImpl::LeaveQueueCounters(ActiveRequest* r) {
  if (!r->in_queue_counters) return;
  r->in_queue_counters = false;
  ++queue_dequeued_requests_;
  queue_dequeued_tokens_ += r->seq.prompt_len;
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
  LeaveQueueCounters(r);
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

}  // namespace dcf
