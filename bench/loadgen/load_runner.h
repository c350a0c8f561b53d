// Drives one load-generator run against a dcformer-server: closed loop (a fixed number of
// calls kept in flight) or open loop (calls started at Poisson arrival times, whatever is in
// flight), each call a streaming Generate on gRPC's callback API.
//
// A run sends `warmup_requests` first (their records are marked warmup and excluded from
// every statistic), then measured requests until `num_requests` were sent or, with
// num_requests == 0, for `duration` from the first measured send; then it waits for every
// call in flight to finish. Latencies are measured from the moment a call is started (in the
// open loop the send lag behind the schedule is reported separately).
//
// Threads: Run blocks the calling thread, which reports progress; calls run on gRPC's
// callback threads (a closed loop starts the next call from the callback of the one that
// finished; nothing there blocks); an open loop adds one dispatcher thread. Not thread-safe:
// one Run at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "bench/loadgen/run_result.h"
#include "bench/loadgen/workload.h"
#include "client/client_channel.h"
#include "dcformer/v1/dcformer.grpc.pb.h"

namespace dcf::loadgen {

// --protocol openai: every call is a streamed POST /v1/completions (SSE, include_usage) on the
// server's OpenAI-compatible front instead of a gRPC Generate, with the same prompt, sampling
// and stopping. One thread per call in flight, each on its own plaintext HTTP/1.1 connection
// (the client's cost, not the server's: the server holds every stream on its fixed pool).
// Tokens per SSE event are not on the wire: each event with text counts one token, and the
// final usage adds any the events did not count (arriving with the last one).
struct HttpTarget {
  std::string host;
  int port = 0;
  std::string model;    // the served model's name (/v1/models, GetModelInfo's model_name)
  std::string api_key;  // empty: none
};

struct RunLimits {
  int64_t warmup_requests = 0;
  int64_t num_requests = 0;  // measured requests; 0: send for `duration`
  absl::Duration duration = absl::ZeroDuration();
};

class LoadRunner {
 public:
  // `channel` (TLS, API key, per-call deadline) must outlive the runner. `request_template`
  // holds the sampling, stopping and output options of every request; each request gets its
  // prompt, max_new_tokens and request_id from the workload.
  LoadRunner(const client::ClientChannel* channel, dcformer::v1::GenerateRequest request_template);
  // Sends over the OpenAI-compatible HTTP front instead (see HttpTarget).
  void UseHttp(HttpTarget target) { http_ = std::move(target); }

  // Runs `load` as described above with prompts from `workload`; `seed` fixes the arrival
  // schedule. Stops sending early once `*interrupt` is true (may be null); calls in flight
  // still finish. `on_progress` (may be empty) is called about every 100 ms on this thread.
  RunResult Run(const LoadSpec& load, const RunLimits& limits, Workload* workload, uint64_t seed,
                const std::atomic<bool>* interrupt,
                const std::function<void(const RunProgress&)>& on_progress);

 private:
  const client::ClientChannel* channel_;
  std::shared_ptr<dcformer::v1::TextGeneration::Stub> stub_;
  dcformer::v1::GenerateRequest template_;
  std::optional<HttpTarget> http_;
};

}  // namespace dcf::loadgen
