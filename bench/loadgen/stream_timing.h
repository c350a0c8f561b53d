// Client-side timing of one streamed Generate call: TTFT, inter-token latencies, TPOT and
// end-to-end latency, from the arrival times of the stream's messages.
//
// Token accounting. The server coalesces tokens generated while a write is in flight, so a
// message may carry k >= 1 tokens; they reach the client together. A message that carries
// k tokens and arrives `gap` after the previous message that carried tokens contributes k
// inter-token latencies of gap / k each (its tokens are spread evenly over the interval they
// were produced in). The extra k - 1 tokens of the first message arrive with the first token
// and contribute k - 1 latencies of 0. Messages without tokens (e.g. the final one) add none.
// Hence a request with n tokens yields exactly n - 1 inter-token latencies whose sum is the
// time from its first to its last token, so their mean over one request equals its TPOT:
//   TTFT = first token's message - start
//   TPOT = (last token's message - first token's message) / (n - 1)     (n >= 2)
//   E2E  = end of the call (status received) - start
// All times are in milliseconds. Thread-compatible (one call's reactor feeds it in order).
#pragma once

#include <chrono>
#include <vector>

namespace dcf::loadgen {

using Clock = std::chrono::steady_clock;

// Milliseconds from `from` to `to`.
inline double MsBetween(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

class StreamTiming {
 public:
  explicit StreamTiming(Clock::time_point start) : start_(start) {}

  // A message carrying `num_tokens` (>= 0) tokens arrived at `t` (non-decreasing).
  void OnMessage(Clock::time_point t, int num_tokens);
  // The call ended (its status arrived) at `t`.
  void OnEnd(Clock::time_point t) { end_ = t; }

  int tokens() const { return tokens_; }
  // Valid when tokens() > 0.
  double ttft_ms() const { return MsBetween(start_, first_token_); }
  // Valid when tokens() >= 2.
  double tpot_ms() const { return MsBetween(first_token_, last_token_) / (tokens_ - 1); }
  // Valid after OnEnd.
  double e2e_ms() const { return MsBetween(start_, end_); }
  // tokens() - 1 entries (none when tokens() == 0), in arrival order.
  const std::vector<double>& itl_ms() const { return itl_ms_; }

 private:
  Clock::time_point start_;
  Clock::time_point first_token_;
  Clock::time_point last_token_;
  Clock::time_point end_;
  int tokens_ = 0;
  std::vector<double> itl_ms_;
};

}  // namespace dcf::loadgen
