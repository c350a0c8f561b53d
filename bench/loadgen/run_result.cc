#include "bench/loadgen/run_result.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dcf::loadgen {

std::string LoadSpec::Label() const {
  if (mode == Mode::kClosed) return absl::StrCat("c=", concurrency);
  return absl::StrFormat("%g/s", rate);
}

RunResult Aggregate(const LoadSpec& load, const std::vector<RequestRecord>& records,
                    double max_send_lag_ms, bool interrupted) {
  RunResult r;
  r.load = load;
  r.max_send_lag_ms = max_send_lag_ms;
  r.interrupted = interrupted;
  double first_start = std::numeric_limits<double>::infinity();
  double last_start = -std::numeric_limits<double>::infinity();
  double last_end = -std::numeric_limits<double>::infinity();
  std::vector<double> ttft, itl, tpot, e2e, ttft_hit, ttft_miss;
  std::map<int, std::vector<double>> ttft_by_turn;
  for (const RequestRecord& q : records) {
    if (q.warmup) {
      ++r.warmup_requests;
      continue;
    }
    ++r.requests;
    first_start = std::min(first_start, q.start_ms);
    last_start = std::max(last_start, q.start_ms);
    last_end = std::max(last_end, q.end_ms);
    if (q.code != "OK") {
      ++r.failed;
      if (r.errors[q.code]++ == 0) r.error_examples[q.code] = q.error_message;
      continue;
    }
    ++r.ok;
    if (!q.finish_reason.empty()) ++r.finish_reasons[q.finish_reason];
    r.input_tokens += q.prompt_tokens;
    r.cached_tokens += q.cached_tokens;
    r.draft_tokens += q.draft_tokens;
    r.accepted_draft_tokens += q.accepted_draft_tokens;
    r.output_tokens += q.output_tokens;
    r.requested_output_tokens += q.requested_output_tokens;
    if (q.output_tokens >= 1) {
      ttft.push_back(q.ttft_ms);
      (q.cached_tokens > 0 ? ttft_hit : ttft_miss).push_back(q.ttft_ms);
      if (q.turn > 0) ttft_by_turn[q.turn].push_back(q.ttft_ms);
    }
    if (q.output_tokens >= 2) tpot.push_back(q.tpot_ms);
    e2e.push_back(q.e2e_ms);
    itl.insert(itl.end(), q.itl_ms.begin(), q.itl_ms.end());
  }
  if (r.draft_tokens > 0) {
    r.acceptance_rate =
        static_cast<double>(r.accepted_draft_tokens) / static_cast<double>(r.draft_tokens);
  }
  if (r.requests > 0) {
    r.duration_s = std::max(0.0, last_end - first_start) / 1e3;
    if (r.duration_s > 0) {
      r.requests_per_s = static_cast<double>(r.ok) / r.duration_s;
      r.output_tokens_per_s = static_cast<double>(r.output_tokens) / r.duration_s;
      r.input_tokens_per_s = static_cast<double>(r.input_tokens) / r.duration_s;
    }
    // n sends span n - 1 inter-arrival gaps.
    if (load.mode == LoadSpec::Mode::kOpen && r.requests >= 2 && last_start > first_start) {
      r.sent_per_s = static_cast<double>(r.requests - 1) / ((last_start - first_start) / 1e3);
    }
  }
  r.ttft_ms = Summarize(std::move(ttft));
  r.itl_ms = Summarize(std::move(itl));
  r.tpot_ms = Summarize(std::move(tpot));
  r.e2e_ms = Summarize(std::move(e2e));
  r.ttft_hit_ms = Summarize(std::move(ttft_hit));
  r.ttft_miss_ms = Summarize(std::move(ttft_miss));
  for (auto& [turn, samples] : ttft_by_turn) r.ttft_ms_by_turn[turn] = Summarize(std::move(samples));
  return r;
}

}  // namespace dcf::loadgen
