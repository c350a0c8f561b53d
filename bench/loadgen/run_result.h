// One load-generator run (one concurrency or one arrival rate): the finished requests and
// what is reported about them. Pure data and logic, no gRPC; thread-compatible.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "bench/loadgen/latency_stats.h"

namespace dcf::loadgen {

// How a run offers load.
struct LoadSpec {
  enum class Mode { kClosed, kOpen };
  Mode mode = Mode::kClosed;
  int concurrency = 0;  // kClosed: requests kept in flight
  double rate = 0;      // kOpen: Poisson arrivals per second
  std::string ModeName() const { return mode == Mode::kClosed ? "closed" : "open"; }
  std::string Label() const;  // "c=8" or "2.5/s"
};

// One finished call, as the runner saw it. Times are client-side, in milliseconds.
struct RequestRecord {
  bool warmup = false;              // among the run's first --warmup-requests: not reported
  std::string code = "OK";          // gRPC status code name of the call
  std::string error_message;        // the status message when code != OK
  double start_ms = 0;              // call start, from the run's start
  double end_ms = 0;                // status received, from the run's start
  int prompt_tokens = 0;            // the server's usage.prompt_tokens; ids sent when it has none
  int output_tokens = 0;            // tokens streamed
  int requested_output_tokens = 0;  // max_new_tokens sent
  std::string finish_reason;        // e.g. "LENGTH"; empty when no final message arrived
  int cached_tokens = 0;            // the server's usage.cached_tokens (prefix-cache hit)
  int draft_tokens = 0;             // the server's usage.draft_tokens (speculation)
  int accepted_draft_tokens = 0;    // the server's usage.accepted_draft_tokens
  int turn = 0;                     // chat workloads: the turn (1, 2, ...); 0 otherwise
  int prefix_group = -1;            // the shared prefix it started with; -1: none
  double ttft_ms = 0;               // when output_tokens >= 1
  double tpot_ms = 0;               // when output_tokens >= 2
  double e2e_ms = 0;
  std::vector<double> itl_ms;  // [output_tokens - 1] (see stream_timing.h)
};

// What is reported about a run. Only measured requests (not warm-up) count. Throughput and
// latencies come from successful (OK) requests; failures are counted by status code.
struct RunResult {
  LoadSpec load;
  int64_t warmup_requests = 0;  // sent and finished, excluded from everything below
  int64_t requests = 0;         // measured requests sent (= ok + failed)
  int64_t ok = 0;
  int64_t failed = 0;
  std::map<std::string, int64_t> errors;              // status code name -> count
  std::map<std::string, std::string> error_examples;  // status code name -> one message
  std::map<std::string, int64_t> finish_reasons;      // of OK requests, e.g. "LENGTH" -> n
  // Measured window: from the first measured request's start to the last one's end.
  double duration_s = 0;
  // Of OK requests: prompt tokens (server-counted), those the server's prefix cache held,
  // tokens streamed, max_new_tokens asked.
  int64_t input_tokens = 0;
  int64_t cached_tokens = 0;
  int64_t output_tokens = 0;
  // Speculative decoding, of OK requests: tokens the server drafted and verified, and those
  // it accepted; acceptance_rate = accepted / drafted (0 when nothing was drafted).
  int64_t draft_tokens = 0;
  int64_t accepted_draft_tokens = 0;
  double acceptance_rate = 0;
  int64_t requested_output_tokens = 0;
  double requests_per_s = 0;  // OK requests / duration_s
  double output_tokens_per_s = 0;
  double input_tokens_per_s = 0;
  // Open loop: measured requests / time from first to last measured send (the offered rate
  // as achieved), and the largest delay of a send behind its scheduled arrival.
  double sent_per_s = 0;
  double max_send_lag_ms = 0;
  bool interrupted = false;  // stopped early by SIGINT
  LatencySummary ttft_ms;    // one sample per OK request with >= 1 token
  LatencySummary itl_ms;     // every inter-token latency of OK requests
  LatencySummary tpot_ms;    // one sample per OK request with >= 2 tokens
  LatencySummary e2e_ms;     // one sample per OK request
  // TTFT of OK requests whose prompt the prefix cache partly held (cached_tokens > 0), and
  // of the others.
  LatencySummary ttft_hit_ms;
  LatencySummary ttft_miss_ms;
  std::map<int, LatencySummary> ttft_ms_by_turn;  // chat workloads: turn -> TTFT
};

// A snapshot of a run in progress, for a progress display.
struct RunProgress {
  int64_t sent = 0;      // measured requests started
  int64_t finished = 0;  // measured requests finished (OK or not)
  int64_t failed = 0;
  int64_t in_flight = 0;
  int64_t total = 0;          // measured requests to send; 0 when duration-bound
  double elapsed_s = 0;       // since the first measured send
  double duration_s = 0;      // when duration-bound
  int64_t output_tokens = 0;  // streamed to measured requests so far
};

// Aggregates `records` (any order) of a run that offered `load`.
RunResult Aggregate(const LoadSpec& load, const std::vector<RequestRecord>& records,
                    double max_send_lag_ms, bool interrupted);

}  // namespace dcf::loadgen
