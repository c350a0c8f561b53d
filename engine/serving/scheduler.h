// Continuous-batching scheduler: decides, step by step, which sequences run and how many of
// their tokens, and reserves their KV blocks. Pure logic over Sequences and a KvCacheManager
// (no model, no threads), so it is unit-tested with fake steps.
//
// One step (Schedule):
//  1. Every running sequence that decodes (one token left to feed) gets its token, oldest
//     admission first. Then running sequences still prefilling get chunks of at most
//     max_prefill_chunk tokens while the step's token budget (max_num_batched_tokens) lasts.
//     A chunk shrinks to what the free blocks allow.
//  2. When a running sequence cannot get even one token's blocks, the most recently admitted
//     running sequence is preempted by recompute: its blocks are freed and it goes back to
//     the FRONT of the waiting queue (state kPreempted); once readmitted it prefills its
//     prompt plus the tokens it already generated, and then samples only new tokens. If the
//     sequence that needs blocks is itself the newest, it is the one preempted.
//  3. If nothing was preempted, waiting sequences are admitted first-come-first-served (the
//     queue head blocks the others) while running < max_num_seqs, budget is left and the
//     blocks for ALL their known tokens fit in the free blocks minus the watermark
//     (ceil(watermark * pool) blocks per group) minus what the prefills already running
//     still need. With nothing running the watermark is ignored, so a request that fits the
//     pool always runs eventually.
// Prefix caching (kv_cache_manager.h): an admitted sequence starts at its longest cached
// prefix (KvCacheManager::FindCachedPrefix), so its first chunk begins there and the cached
// tokens cost no budget; the hit's blocks that are cached but free count among the blocks
// it takes (KvCacheManager::BlocksToAdmit), and cached-but-free blocks count as free
// everywhere else (admission, chunk fits, preemption). A sequence preempted by recompute
// frees its blocks into the cache, and its readmission takes back whatever of them is still
// cached.
// max_num_seqs is clamped to max_num_batched_tokens so that every decoding sequence advances
// every step.
// Pipelined steps (Sequence::num_pending): a running sequence's pending token (still being
// sampled by the step in flight) is scheduled like a known one, as its decode chunk, except
// when it is its last (max_len tokens): that sequence gets no chunk. A sequence preempted with
// a pending token keeps it; the caller must fill it before the next Schedule (the engine does:
// a Schedule that preempts admits nothing, and the step in flight completes before the next
// one), which aborts when it would admit a sequence with a pending token.
//  4. Speculative decoding, last (so drafts never take budget or blocks from decodes,
//     prefill chunks or admissions, and never cause a preemption): when nothing was
//     preempted, each decode chunk of a sequence with a draft (Sequence::draft), oldest first,
//     grows by the longest prefix of its draft that the budget left, max_draft_tokens (the
//     step's total), max_draft_step_tokens (the step's tokens with the drafts, when set) and
//     the free blocks above the watermark allow. Its blocks past what
//     Commit keeps go back at Commit.
//
// After the model ran the step, Commit marks the chunks computed (window blocks out of the
// window are freed); the caller then appends the sampled token of each chunk with
// `samples`, or Removes the sequence when it finished.
//
// Not thread-safe: owned by the engine loop thread. Sequences are not owned; a sequence must
// be Removed before it is destroyed.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <vector>

#include "absl/types/span.h"
#include "engine/kv/kv_cache_manager.h"
#include "engine/serving/sequence.h"

namespace dcf {

struct SchedulerConfig {
  int max_num_seqs = 64;
  int max_num_batched_tokens = 512;
  int max_prefill_chunk = 0;  // tokens per prefill chunk; 0 = up to the step budget
  double watermark = 0.01;    // fraction of each pool kept free when admitting
  int max_draft_tokens = 0;   // drafted tokens verified per step, all sequences; 0 = none
  // > 0: drafts fill a step only up to this many tokens, everything scheduled before them
  // included (the memory-bound budget, engine.h EngineOptions::spec_step_tokens); 0: no cap.
  int max_draft_step_tokens = 0;
};

struct ScheduledChunk {
  Sequence* seq = nullptr;
  int start = 0;        // first position (== seq->kv.num_tokens)
  int num_tokens = 0;   // tokens seq->tokens[start, start + num_tokens)
  bool samples = false; // reaches the end of the known tokens: sample a token from its logits
  // Of num_tokens, the last num_draft are seq->draft[0, num_draft) (verified: the chunk
  // samples its last num_draft + 1 rows).
  int num_draft = 0;
};

struct SchedulerOutput {
  std::vector<ScheduledChunk> chunks;  // the batch, in order
  std::vector<Sequence*> preempted;    // preempted in this step (now waiting)
  std::vector<Sequence*> admitted;     // moved from waiting to running in this step
  std::vector<int> cached_tokens;      // [admitted] tokens each took from the prefix cache
  int num_tokens = 0;
  int num_prefill_tokens = 0;          // tokens of chunks of sequences in kPrefill
  int num_draft_tokens = 0;            // drafted tokens the chunks verify (in num_tokens)
  bool empty() const { return chunks.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, KvCacheManager* kv);

  // Queues a new sequence (state kQueued, no blocks) at the back of the waiting queue.
  void Add(Sequence* seq);
  // Plans one step and reserves its blocks (see the header comment).
  SchedulerOutput Schedule();
  // Marks the planned chunks computed; sequences whose chunk `samples` move to kDecode.
  // `accepted_drafts` ([chunks], or empty when no chunk has a draft): how many of a chunk's
  // drafted tokens were accepted; only the chunk up to them is committed (its sequence's
  // tokens must already hold them) and the blocks reserved past it are released.
  void Commit(const SchedulerOutput& out, absl::Span<const int> accepted_drafts = {});
  // Drops `seq` from the waiting queue or the running set and frees its blocks. The state is
  // left to the caller (finished, cancelled, failed).
  void Remove(Sequence* seq);

  bool HasWork() const { return !waiting_.empty() || !running_.empty(); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_running() const { return static_cast<int>(running_.size()); }
  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const std::vector<Sequence*>& running() const { return running_; }  // admission order
  int64_t num_preemptions() const { return num_preemptions_; }
  const SchedulerConfig& config() const { return config_; }
  const KvCacheManager& kv() const { return *kv_; }

 private:
  // Largest n in [1, want] whose blocks can be reserved now (0 if none).
  int LargestFit(const Sequence& seq, int want) const;
  void Preempt(Sequence* victim, SchedulerOutput* out, int* budget);
  // Blocks group `g` needs for `seq` to cache all its known tokens.
  int OutstandingBlocks(const Sequence& seq, LayerGroup g) const;

  SchedulerConfig config_;
  KvCacheManager* kv_;
  std::array<int, kNumLayerGroups> watermark_blocks_{0, 0};
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // admission order, oldest first
  int64_t num_preemptions_ = 0;
};

}  // namespace dcf
