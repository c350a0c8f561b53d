// The engine loop's bookkeeping of pipelined steps (docs/DESIGN.md "Pipelined steps"): the
// step launched last whose results were not waited for yet (at most one: the backend holds
// two steps in flight, and the engine completes the older one right after launching the
// newer), which request each of its chunks belongs to (a request that ends meanwhile is
// dropped from it, so no pointer to it is kept), the counters EngineStats reports, and the
// step times EngineObserver::OnStep reports, which never overlap.
//
// Pure bookkeeping: it touches no backend or request (ActiveRequest is only named); of the
// sequences, only their pending tokens (Sequence::num_pending). Engine loop thread only; not
// thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/time/time.h"
#include "engine/serving/scheduler.h"

namespace dcf::engine_internal {

struct ActiveRequest;  // engine_impl.h

// A pipelined step: launched and committed, its results not waited for yet.
struct InFlightStep {
  // [chunks] the request of each chunk; null once it ended (its results are dropped).
  std::vector<ActiveRequest*> owners;
  std::vector<int32_t> slots;       // [chunks] its output slot where it samples, else -1
  std::vector<int32_t> num_tokens;  // [chunks]
  int num_tokens_total = 0, num_prefill_tokens = 0;
  absl::Time start;  // when its planning began
};

class StepPipeline {
 public:
  bool has_in_flight() const { return in_flight_.has_value(); }
  // The step in flight; null when none.
  const InFlightStep* in_flight() const { return in_flight_ ? &*in_flight_ : nullptr; }

  // The step `out` plans was launched (`owners`: the request of each chunk; `slots`: its
  // StepBatch::slot_offsets, one per chunk and the end; `start`: when its planning began). It
  // is now the step in flight, and each sequence it samples for gets the token it samples as a
  // pending token (kPendingToken, known when its results come: meanwhile the next step's
  // chained decode token). Returns the step it was chained to (in flight until now, to be
  // completed next), if any, counted as a chained step.
  std::optional<InFlightStep> Launched(const SchedulerOutput& out,
                                       std::vector<ActiveRequest*> owners,
                                       const std::vector<int32_t>& slots, absl::Time start);
  // The chunks of `out`, the step in flight's plan, whose request has not ended (to commit).
  SchedulerOutput LiveChunks(const SchedulerOutput& out) const;
  // The step in flight leaves the pipeline (to be completed: serially, or at shutdown);
  // nullopt when none.
  std::optional<InFlightStep> Take();
  // The backend failed: the step in flight is lost with it, never to be waited for.
  void Abandon() { in_flight_.reset(); }
  // `owner` ended: its chunks of the step in flight are computed for nothing (owner null).
  void Drop(const ActiveRequest* owner);
  // `step`'s results were waited for: the tokens of its dropped chunks count as dropped.
  void Completed(const InFlightStep& step);

  // The time of a step planned at `start` whose results were processed at `now`, for
  // EngineObserver::OnStep: from `start`, or from the end of the step reported before when
  // that is later (pipelined, a step is planned while the one before is on the device).
  // Reported times therefore never overlap and add up to at most the time spent. Every step
  // is reported once, in order.
  absl::Duration StepTime(absl::Time start, absl::Time now);

  int64_t chained_steps() const { return chained_steps_; }  // EngineStats::chained_steps
  // EngineStats::pipeline_dropped_tokens
  int64_t dropped_tokens() const { return dropped_tokens_; }

 private:
  std::optional<InFlightStep> in_flight_;
  int64_t chained_steps_ = 0;
  int64_t dropped_tokens_ = 0;
  absl::Time last_step_end_ = absl::InfinitePast();
};

}  // namespace dcf::engine_internal
