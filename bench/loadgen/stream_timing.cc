#include "bench/loadgen/stream_timing.h"

namespace dcf::loadgen {

void StreamTiming::OnMessage(Clock::time_point t, int num_tokens) {
  if (num_tokens <= 0) return;
  if (tokens_ == 0) {
    first_token_ = t;
    itl_ms_.insert(itl_ms_.end(), num_tokens - 1, 0.0);
  } else {
    const double share = MsBetween(last_token_, t) / num_tokens;
    itl_ms_.insert(itl_ms_.end(), num_tokens, share);
  }
  last_token_ = t;
  tokens_ += num_tokens;
}

}  // namespace dcf::loadgen
