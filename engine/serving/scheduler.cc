#include "engine/serving/scheduler.h"

#include <algorithm>
#include <cmath>

#include "engine/common/logging.h"

namespace dcf {

Scheduler::Scheduler(const SchedulerConfig& config, KvCacheManager* kv)
    : config_(config), kv_(kv) {
  DCF_CHECK(config_.max_num_batched_tokens > 0);
  DCF_CHECK(config_.max_num_seqs > 0);
  config_.max_num_seqs = std::min(config_.max_num_seqs, config_.max_num_batched_tokens);
  if (config_.max_prefill_chunk <= 0) config_.max_prefill_chunk = config_.max_num_batched_tokens;
  for (int g = 0; g < kNumLayerGroups; ++g) {
    const int pool = kv_->allocator(static_cast<LayerGroup>(g)).num_blocks();
    watermark_blocks_[g] = static_cast<int>(std::ceil(config_.watermark * pool));
  }
}

void Scheduler::Add(Sequence* seq) {
  DCF_CHECK(seq->state == RequestState::kQueued && seq->kv.num_tokens == 0);
  waiting_.push_back(seq);
}

int Scheduler::LargestFit(const Sequence& seq, int want) const {
  // The blocks a chunk needs never shrink as it grows, so "fits" is monotone in n: binary
  // search for the largest n that fits.
  const int start = seq.kv.num_tokens;
  if (kv_->CanReserve(seq.kv, start + want)) return want;
  int lo = 0, hi = want;  // fits(lo) (or lo == 0), !fits(hi)
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    if (kv_->CanReserve(seq.kv, start + mid)) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

int Scheduler::OutstandingBlocks(const Sequence& seq, LayerGroup g) const {
  return kv_->BlocksToHold(seq.kv, g, static_cast<int>(seq.tokens.size()));
}

void Scheduler::Preempt(Sequence* victim, SchedulerOutput* out, int* budget) {
  auto it = std::find_if(out->chunks.begin(), out->chunks.end(),
                         [&](const ScheduledChunk& c) { return c.seq == victim; });
  if (it != out->chunks.end()) {
    *budget += it->num_tokens;
    out->num_tokens -= it->num_tokens;
    if (victim->state == RequestState::kPrefill) out->num_prefill_tokens -= it->num_tokens;
    out->chunks.erase(it);
  }
  auto adm = std::find(out->admitted.begin(), out->admitted.end(), victim);
  if (adm != out->admitted.end()) {
    out->cached_tokens.erase(out->cached_tokens.begin() + (adm - out->admitted.begin()));
    out->admitted.erase(adm);
  }
  kv_->Free(victim->kv);
  running_.erase(std::find(running_.begin(), running_.end(), victim));
  SetState(*victim, RequestState::kPreempted);
  ++victim->num_preemptions;
  waiting_.push_front(victim);
  out->preempted.push_back(victim);
  ++num_preemptions_;
}

SchedulerOutput Scheduler::Schedule() {
  SchedulerOutput out;
  int budget = config_.max_num_batched_tokens;
  const auto scheduled = [&](const Sequence* s) {
    return std::any_of(out.chunks.begin(), out.chunks.end(),
                       [&](const ScheduledChunk& c) { return c.seq == s; });
  };
  const auto add_chunk = [&](Sequence* s, int n) {
    const int start = s->kv.num_tokens;
    const absl::Status st = kv_->Reserve(s->kv, start + n);
    DCF_CHECK(st.ok()) << st.message();
    out.chunks.push_back({s, start, n, start + n == static_cast<int>(s->tokens.size())});
    out.num_tokens += n;
    if (s->state == RequestState::kPrefill) out.num_prefill_tokens += n;
    budget -= n;
  };

  // 1-2: running sequences, decodes before prefill chunks, oldest first.
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < running_.size(); ++i) {
      Sequence* seq = running_[i];
      // Its last token, still being sampled, is its last one (max_len): nothing to compute.
      if (seq->num_pending > 0 && static_cast<int>(seq->tokens.size()) >= seq->max_len) continue;
      const int rem = seq->remaining();
      DCF_CHECK(rem >= 1) << "running sequence " << seq->seq_id << " has nothing to feed";
      if ((pass == 0) != (rem == 1) || scheduled(seq)) continue;
      if (budget <= 0) break;
      const int want = std::min({rem, budget, config_.max_prefill_chunk});
      bool self_preempted = false;
      while (true) {
        const int n = LargestFit(*seq, want);
        if (n > 0) {
          add_chunk(seq, n);
          break;
        }
        Sequence* victim = running_.back();
        Preempt(victim, &out, &budget);
        if (victim == seq) {
          self_preempted = true;
          break;
        }
      }
      if (self_preempted) break;  // seq was the newest: nothing after it is running
    }
  }
  if (!out.preempted.empty()) return out;

  // 3: admission, first come first served.
  std::array<int, kNumLayerGroups> outstanding{0, 0};
  for (const Sequence* s : running_) {
    for (int g = 0; g < kNumLayerGroups; ++g) {
      outstanding[g] += OutstandingBlocks(*s, static_cast<LayerGroup>(g));
    }
  }
  while (!waiting_.empty() && static_cast<int>(running_.size()) < config_.max_num_seqs &&
         budget > 0) {
    Sequence* seq = waiting_.front();
    // Its prefix-cache lookup and prefill need every token. One preempted while a step was
    // sampling its last token was preempted by a Schedule that admits nothing (it returned
    // above), and the caller fills pending tokens before the next Schedule (scheduler.h).
    DCF_CHECK(seq->num_pending == 0)
        << "admitting sequence " << seq->seq_id << " with a pending token: the step that "
        << "samples it must complete before the next Schedule";
    const int len = static_cast<int>(seq->tokens.size());
    // The longest cached prefix (empty without prefix caching); its blocks count as computed.
    const PrefixHit hit = kv_->FindCachedPrefix(seq->kv, seq->tokens);
    if (!running_.empty()) {
      const std::array<int, kNumLayerGroups> take = kv_->BlocksToAdmit(seq->kv, hit, len);
      bool fits = true;
      for (int g = 0; g < kNumLayerGroups; ++g) {
        const LayerGroup lg = static_cast<LayerGroup>(g);
        if (take[g] + outstanding[g] + watermark_blocks_[g] > kv_->num_free(lg)) fits = false;
      }
      if (!fits) break;
    }
    kv_->AcquirePrefix(seq->kv, hit);
    const int want = std::min({seq->remaining(), budget, config_.max_prefill_chunk});
    const int n = LargestFit(*seq, want);
    if (n == 0) {
      kv_->Free(seq->kv);  // gives the hit back
      break;
    }
    waiting_.pop_front();
    SetState(*seq, RequestState::kPrefill);
    running_.push_back(seq);
    out.admitted.push_back(seq);
    out.cached_tokens.push_back(hit.num_tokens);
    add_chunk(seq, n);
    for (int g = 0; g < kNumLayerGroups; ++g) {
      outstanding[g] += OutstandingBlocks(*seq, static_cast<LayerGroup>(g));
    }
  }

  // 4: drafts, from what is left.
  int draft_budget = std::min(budget, config_.max_draft_tokens);
  if (config_.max_draft_step_tokens > 0) {
    draft_budget = std::min(draft_budget, config_.max_draft_step_tokens - out.num_tokens);
  }
  for (ScheduledChunk& c : out.chunks) {
    if (draft_budget <= 0) break;
    Sequence* s = c.seq;
    if (s->draft.empty() || c.num_tokens != 1 || !c.samples ||
        s->state != RequestState::kDecode) {
      continue;
    }
    int d = std::min(static_cast<int>(s->draft.size()), draft_budget);
    const auto fits = [&](int n) {
      for (int g = 0; g < kNumLayerGroups; ++g) {
        const LayerGroup lg = static_cast<LayerGroup>(g);
        if (kv_->BlocksNeeded(s->kv, lg, c.start + 1 + n) + watermark_blocks_[g] >
            kv_->num_free(lg)) {
          return false;
        }
      }
      return true;
    };
    while (d > 0 && !fits(d)) --d;
    if (d == 0) continue;
    const absl::Status st = kv_->Reserve(s->kv, c.start + 1 + d);
    DCF_CHECK(st.ok()) << st.message();
    c.num_tokens += d;
    c.num_draft = d;
    out.num_tokens += d;
    out.num_draft_tokens += d;
    budget -= d;
    draft_budget -= d;
  }
  return out;
}

void Scheduler::Commit(const SchedulerOutput& out, absl::Span<const int> accepted_drafts) {
  for (size_t i = 0; i < out.chunks.size(); ++i) {
    const ScheduledChunk& c = out.chunks[i];
    if (c.num_draft > 0) {
      DCF_CHECK(i < accepted_drafts.size() && accepted_drafts[i] >= 0 &&
                accepted_drafts[i] <= c.num_draft)
          << "Commit of a verify chunk without its accepted count";
      kv_->Commit(c.seq->kv, c.start + 1 + accepted_drafts[i], c.seq->tokens);
      kv_->ReleaseUncommitted(c.seq->kv);
      continue;
    }
    kv_->Commit(c.seq->kv, c.start + c.num_tokens, c.seq->tokens);
    if (c.samples && c.seq->state == RequestState::kPrefill) {
      SetState(*c.seq, RequestState::kDecode);
    }
  }
}

void Scheduler::Remove(Sequence* seq) {
  auto r = std::find(running_.begin(), running_.end(), seq);
  if (r != running_.end()) running_.erase(r);
  auto w = std::find(waiting_.begin(), waiting_.end(), seq);
  if (w != waiting_.end()) waiting_.erase(w);
  kv_->Free(seq->kv);
}

}  // namespace dcf
