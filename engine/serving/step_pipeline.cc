#include "engine/serving/step_pipeline.h"

#include <algorithm>
#include <utility>

#include "engine/common/logging.h"

namespace dcf::engine_internal {

std::optional<InFlightStep> StepPipeline::Launched(const SchedulerOutput& out,
                                                   std::vector<ActiveRequest*> owners,
                                                   const std::vector<int32_t>& slots,
                                                   absl::Time start) {
  DCF_CHECK(owners.size() == out.chunks.size() && slots.size() >= out.chunks.size())
      << "a chunk without its request or slot";
  InFlightStep step;
  step.owners = std::move(owners);
  step.slots.assign(out.chunks.size(), -1);
  step.num_tokens.resize(out.chunks.size());
  for (size_t i = 0; i < out.chunks.size(); ++i) {
    const ScheduledChunk& c = out.chunks[i];
    step.num_tokens[i] = c.num_tokens;
    if (!c.samples) continue;
    c.seq->tokens.push_back(kPendingToken);
    ++c.seq->num_pending;
    step.slots[i] = slots[i];
  }
  step.num_tokens_total = out.num_tokens;
  step.num_prefill_tokens = out.num_prefill_tokens;
  step.start = start;
  std::optional<InFlightStep> previous = std::move(in_flight_);
  in_flight_ = std::move(step);
  if (previous.has_value()) ++chained_steps_;
  return previous;
}

SchedulerOutput StepPipeline::LiveChunks(const SchedulerOutput& out) const {
  DCF_CHECK(in_flight_.has_value() && in_flight_->owners.size() == out.chunks.size())
      << "LiveChunks of a plan that is not the step in flight";
  SchedulerOutput live;
  for (size_t i = 0; i < out.chunks.size(); ++i) {
    if (in_flight_->owners[i] != nullptr) live.chunks.push_back(out.chunks[i]);
  }
  return live;
}

std::optional<InFlightStep> StepPipeline::Take() {
  std::optional<InFlightStep> step = std::move(in_flight_);
  in_flight_.reset();
  return step;
}

void StepPipeline::Drop(const ActiveRequest* owner) {
  if (!in_flight_.has_value()) return;
  for (ActiveRequest*& o : in_flight_->owners) {
    if (o == owner) o = nullptr;
  }
}

void StepPipeline::Completed(const InFlightStep& step) {
  for (size_t i = 0; i < step.owners.size(); ++i) {
    if (step.owners[i] == nullptr) dropped_tokens_ += step.num_tokens[i];
  }
}

absl::Duration StepPipeline::StepTime(absl::Time start, absl::Time now) {
  // Counted from its planning, a pipelined step would also span the step before's results,
  // and the times would add up to about twice the time spent.
  const absl::Duration time = now - std::max(start, last_step_end_);
  last_step_end_ = now;
  return time;
}

}  // namespace dcf::engine_internal
