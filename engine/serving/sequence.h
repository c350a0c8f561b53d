// The scheduler's view of one request: its tokens, how many of them the KV cache holds, and
// its lifecycle state. Plain data owned by the engine (one per request); the scheduler keeps
// pointers to it while the request is waiting or running.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/kv/kv_cache_manager.h"
#include "engine/serving/request.h"

namespace dcf {

// The placeholder of a token a launched step is still sampling (Sequence::num_pending).
inline constexpr int32_t kPendingToken = -1;

struct Sequence {
  int64_t seq_id = 0;           // unique; increases with arrival (FCFS order)
  std::vector<int32_t> tokens;  // prompt + generated so far
  int prompt_len = 0;
  int max_len = 0;              // prompt_len + max_new_tokens: never more tokens than this
  SequenceKv kv;                // kv.num_tokens: positions whose K/V are cached
  RequestState state = RequestState::kQueued;
  int num_preemptions = 0;
  // Speculative decoding: tokens proposed to follow `tokens` (not part of it), set by the
  // engine before each step; the scheduler verifies a prefix of them in a decode chunk when
  // the step's budget and blocks allow (Scheduler::Schedule).
  std::vector<int32_t> draft;
  // Pipelined steps (engine.h EngineOptions::pipeline_steps): the last num_pending entries of
  // `tokens` are kPendingToken, tokens that launched steps are still sampling (at most 2: the
  // step in flight's and the next one's, between its Launch and the first one's results).
  // The engine fills them in order as the steps' results come; no KV block holding one is
  // ever committed. Always 0 without pipelining.
  int num_pending = 0;

  // Pending tokens included: the draw counter of the next token sampled.
  int num_generated() const { return static_cast<int>(tokens.size()) - prompt_len; }
  // Tokens still to run through the model before the next token can be sampled.
  int remaining() const { return static_cast<int>(tokens.size()) - kv.num_tokens; }
};

// The only place request states change: checks the transition against IsValidTransition
// (request.h) and aborts on a violation (a bug, never an input error).
void SetState(Sequence& seq, RequestState to);

}  // namespace dcf
