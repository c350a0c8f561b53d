#include "bench/loadgen/load_runner.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "bench/loadgen/poisson_arrivals.h"
#include "bench/loadgen/stream_timing.h"
#include "boost/asio/connect.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"

namespace dcf::loadgen {
namespace {

namespace v1 = ::dcformer::v1;

// Everything one run's calls share. Held by shared_ptr from every call, so that a callback
// still returning after Run saw the last call finish never touches freed memory.
struct RunState {
  // Fixed before the first send.
  const client::ClientChannel* channel = nullptr;
  std::shared_ptr<v1::TextGeneration::Stub> stub;
  const v1::GenerateRequest* request_template = nullptr;
  LoadSpec load;
  RunLimits limits;
  const std::atomic<bool>* interrupt = nullptr;
  Clock::time_point run_start;
  const HttpTarget* http = nullptr;  // set: calls go to the OpenAI front

  absl::Mutex mu;
  Workload* workload ABSL_GUARDED_BY(mu) = nullptr;
  int64_t sent ABSL_GUARDED_BY(mu) = 0;  // warm-up included
  int64_t in_flight ABSL_GUARDED_BY(mu) = 0;
  bool sending_done ABSL_GUARDED_BY(mu) = false;
  std::optional<Clock::time_point> measure_start ABSL_GUARDED_BY(mu);
  double max_send_lag_ms ABSL_GUARDED_BY(mu) = 0;
  std::vector<RequestRecord> records ABSL_GUARDED_BY(mu);
  int64_t measured_finished ABSL_GUARDED_BY(mu) = 0;
  int64_t measured_failed ABSL_GUARDED_BY(mu) = 0;
  // Tokens streamed to measured requests so far (progress display only).
  std::atomic<int64_t> measured_tokens{0};

  bool Interrupted() const { return interrupt != nullptr && interrupt->load(); }

  // Whether another call may start at `now`. Once false it stays false (its inputs only
  // grow), so the first false ends sending.
  bool ShouldSend(Clock::time_point now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (Interrupted()) return false;
    if (sent < limits.warmup_requests) return true;
    if (limits.num_requests > 0) return sent < limits.warmup_requests + limits.num_requests;
    return !measure_start.has_value() ||
           now - *measure_start < absl::ToChronoNanoseconds(limits.duration);
  }

  bool Done() const ABSL_SHARED_LOCKS_REQUIRED(mu) { return sending_done && in_flight == 0; }
};

bool MaybeSend(const std::shared_ptr<RunState>& state,
               std::optional<Clock::time_point> scheduled = std::nullopt,
               std::optional<PromptSpec> turn = std::nullopt);
// `spec` and `output` (the call's prompt and the tokens it streamed) continue a chat; an HTTP
// call passes neither (the loadgen refuses --chat-turns with --protocol openai).
void FinishCall(const std::shared_ptr<RunState>& state, RequestRecord record,
                StreamTiming timing, Clock::time_point end, const PromptSpec* spec = nullptr,
                const std::vector<int32_t>* output = nullptr);

// The body of POST /v1/completions for `request` (prompt, sampling, stopping), streamed.
std::string CompletionBody(const v1::GenerateRequest& request, const std::string& model) {
  nlohmann::json body = {{"model", model},
                         {"stream", true},
                         {"stream_options", {{"include_usage", true}}},
                         {"max_tokens", request.stopping().max_new_tokens()},
                         {"ignore_eos", request.stopping().ignore_eos()}};
  if (request.has_token_ids()) {
    body["prompt"] = std::vector<int32_t>(request.token_ids().ids().begin(),
                                          request.token_ids().ids().end());
  } else {
    body["prompt"] = request.text();
  }
  const v1::SamplingParams& s = request.sampling();
  if (s.has_temperature()) body["temperature"] = s.temperature();
  if (s.has_top_k()) body["top_k"] = s.top_k();
  if (s.has_top_p()) body["top_p"] = s.top_p();
  if (s.has_min_p()) body["min_p"] = s.min_p();
  if (s.has_repetition_penalty()) body["repetition_penalty"] = s.repetition_penalty();
  if (s.has_presence_penalty()) body["presence_penalty"] = s.presence_penalty();
  if (s.has_frequency_penalty()) body["frequency_penalty"] = s.frequency_penalty();
  if (s.has_seed()) body["seed"] = static_cast<int64_t>(s.seed());
  return body.dump();
}

// One streamed completion over HTTP/1.1 on its own thread and connection (see HttpTarget).
void RunHttpCall(std::shared_ptr<RunState> state, std::string body, RequestRecord record) {
  namespace beast = boost::beast;
  namespace http = beast::http;
  using boost::asio::ip::tcp;
  const HttpTarget& target = *state->http;
  Clock::time_point start = Clock::now();
  record.start_ms = MsBetween(state->run_start, start);
  StreamTiming timing(start);
  auto fail = [&](std::string code, std::string message) {
    record.code = std::move(code);
    record.error_message = std::move(message);
  };
  try {
    boost::asio::io_context ioc;
    tcp::resolver resolver(ioc);
    beast::tcp_stream stream(ioc);
    stream.connect(resolver.resolve(target.host, std::to_string(target.port)));
    stream.socket().set_option(tcp::no_delay(true));
    http::request<http::string_body> req(http::verb::post, "/v1/completions", 11);
    req.set(http::field::host, target.host);
    req.set(http::field::content_type, "application/json");
    if (!target.api_key.empty()) req.set(http::field::authorization, "Bearer " + target.api_key);
    req.body() = std::move(body);
    req.prepare_payload();
    http::write(stream, req);
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(std::numeric_limits<std::uint64_t>::max());
    std::string pending;  // SSE bytes not yet split into events
    int counted = 0, usage_tokens = -1;
    std::string finish;
    auto on_event = [&](absl::string_view data) {
      if (data == "[DONE]") return;
      nlohmann::json event = nlohmann::json::parse(data, nullptr, false);
      if (event.is_discarded()) return;
      if (event.contains("error")) {
        fail("INTERNAL", event["error"].value("message", "stream error"));
        return;
      }
      if (event.contains("usage") && event["usage"].is_object()) {
        usage_tokens = event["usage"].value("completion_tokens", 0);
        record.prompt_tokens = event["usage"].value("prompt_tokens", record.prompt_tokens);
      }
      for (const auto& c : event.value("choices", nlohmann::json::array())) {
        const bool has_text = c.contains("text") && !c["text"].get<std::string>().empty();
        if (has_text) {
          timing.OnMessage(Clock::now(), 1);
          ++counted;
        }
        if (c.contains("finish_reason") && c["finish_reason"].is_string()) {
          finish = c["finish_reason"].get<std::string>();
        }
      }
    };
    auto on_chunk = [&](std::uint64_t, beast::string_view chunk, beast::error_code&) {
      pending.append(chunk.data(), chunk.size());
      for (size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
        absl::string_view e(pending.data(), end);
        if (absl::ConsumePrefix(&e, "data: ")) on_event(e);
        pending.erase(0, end + 2);
      }
      return chunk.size();
    };
    parser.on_chunk_body(on_chunk);
    http::read_header(stream, buffer, parser);
    const int status = parser.get().result_int();
    if (status != 200) {
      http::read(stream, buffer, parser);
      nlohmann::json error = nlohmann::json::parse(parser.get().body(), nullptr, false);
      const std::string message = error.is_object() && error.contains("error")
                                      ? error["error"].value("message", "")
                                      : parser.get().body();
      fail(status == 429 ? "RESOURCE_EXHAUSTED"
           : status == 503 ? "UNAVAILABLE"
           : status == 401 ? "UNAUTHENTICATED"
           : status >= 500 ? "INTERNAL"
                           : "INVALID_ARGUMENT",
           absl::StrCat("HTTP ", status, ": ", message));
    } else {
      http::read(stream, buffer, parser);
      if (usage_tokens > counted) timing.OnMessage(Clock::now(), usage_tokens - counted);
      record.finish_reason = absl::AsciiStrToUpper(finish);
    }
    beast::error_code ignored;
    stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  } catch (const std::exception& e) {
    fail("UNAVAILABLE", e.what());
  }
  if (!record.warmup) state->measured_tokens += timing.tokens();
  FinishCall(state, std::move(record), std::move(timing), Clock::now());
}

// One streaming Generate call. Deletes itself in OnDone, after handing its record over.
class GenerateCall final : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  GenerateCall(std::shared_ptr<RunState> state, v1::GenerateRequest request, RequestRecord record,
               PromptSpec spec)
      : state_(std::move(state)),
        request_(std::move(request)),
        record_(std::move(record)),
        spec_(std::move(spec)),
        timing_(Clock::now()) {}

  void Start() {
    state_->channel->Prepare(&context_);
    state_->stub->async()->Generate(&context_, &request_, this);
    StartRead(&response_);
    const Clock::time_point now = Clock::now();
    timing_ = StreamTiming(now);
    record_.start_ms = MsBetween(state_->run_start, now);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // end of stream: OnDone follows
    timing_.OnMessage(Clock::now(), response_.token_ids_size());
    if (!record_.warmup) state_->measured_tokens += response_.token_ids_size();
    if (spec_.turn > 0) output_.insert(output_.end(), response_.token_ids().begin(),
                                       response_.token_ids().end());
    if (response_.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      std::string reason = v1::FinishReason_Name(response_.finish_reason());
      record_.finish_reason = std::string(absl::StripPrefix(reason, "FINISH_REASON_"));
      if (response_.has_usage()) {
        record_.prompt_tokens = response_.usage().prompt_tokens();
        record_.cached_tokens = response_.usage().cached_tokens();
        record_.draft_tokens = response_.usage().draft_tokens();
        record_.accepted_draft_tokens = response_.usage().accepted_draft_tokens();
      }
    }
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override;

 private:
  std::shared_ptr<RunState> state_;
  grpc::ClientContext context_;
  v1::GenerateRequest request_;
  v1::GenerateResponse response_;
  RequestRecord record_;
  PromptSpec spec_;
  std::vector<int32_t> output_;  // chat turns: the tokens streamed, for the next turn
  StreamTiming timing_;
};

// Starts one call if the run may still send; returns whether it did. `scheduled` is the
// open loop's arrival time (its lag is recorded). `turn`: a chat's next turn to send instead
// of the workload's next request.
bool MaybeSend(const std::shared_ptr<RunState>& state,
               std::optional<Clock::time_point> scheduled, std::optional<PromptSpec> turn) {
  GenerateCall* call = nullptr;
  {
    absl::MutexLock lock(&state->mu);
    if (state->sending_done) return false;
    const Clock::time_point now = Clock::now();
    if (!state->ShouldSend(now)) {
      state->sending_done = true;
      return false;
    }
    if (scheduled.has_value()) {
      state->max_send_lag_ms = std::max(state->max_send_lag_ms, MsBetween(*scheduled, now));
    }
    const int64_t index = state->sent++;
    ++state->in_flight;
    RequestRecord record;
    record.warmup = index < state->limits.warmup_requests;
    if (!record.warmup && !state->measure_start.has_value()) state->measure_start = now;
    PromptSpec spec = turn.has_value() ? *std::move(turn) : state->workload->Next();
    record.turn = spec.turn;
    record.prefix_group = spec.prefix_group;
    v1::GenerateRequest request = *state->request_template;
    request.set_request_id(absl::StrCat("loadgen-", index));
    if (spec.token_ids.empty()) {
      request.set_text(std::move(spec.text));
    } else {
      record.prompt_tokens = static_cast<int>(spec.token_ids.size());
      request.mutable_token_ids()->mutable_ids()->Add(spec.token_ids.begin(), spec.token_ids.end());
    }
    request.mutable_stopping()->set_max_new_tokens(spec.max_new_tokens);
    record.requested_output_tokens = spec.max_new_tokens;
    if (state->http != nullptr) {
      std::thread(RunHttpCall, state, CompletionBody(request, state->http->model),
                  std::move(record))
          .detach();  // holds `state`; Run returns once every call handed its record over
      return true;
    }
    call = new GenerateCall(state, std::move(request), std::move(record), std::move(spec));
  }
  call->Start();  // without the lock: gRPC may run reactions inline
  return true;
}

// Hands a finished call's record over; a chat's next turn, or in a closed loop the next
// request, starts in its slot.
void FinishCall(const std::shared_ptr<RunState>& state, RequestRecord record,
                StreamTiming timing, Clock::time_point end, const PromptSpec* spec,
                const std::vector<int32_t>* output) {
  timing.OnEnd(end);
  record.end_ms = MsBetween(state->run_start, end);
  record.output_tokens = timing.tokens();
  if (timing.tokens() >= 1) record.ttft_ms = timing.ttft_ms();
  if (timing.tokens() >= 2) record.tpot_ms = timing.tpot_ms();
  record.e2e_ms = timing.e2e_ms();
  record.itl_ms = timing.itl_ms();
  const bool ok = record.code == "OK";
  std::optional<PromptSpec> next_turn;
  {
    absl::MutexLock lock(&state->mu);
    --state->in_flight;
    if (!record.warmup) {
      ++state->measured_finished;
      if (record.code != "OK") ++state->measured_failed;
    }
    state->records.push_back(std::move(record));
    // A chat goes on with its next turn at once (a failed turn ends the conversation).
    if (ok && spec != nullptr) next_turn = state->workload->NextTurn(*spec, *output);
  }
  if (next_turn.has_value()) {
    MaybeSend(state, std::nullopt, std::move(next_turn));
  } else if (state->load.mode == LoadSpec::Mode::kClosed) {
    MaybeSend(state);  // this call's slot starts the next request
  }
}

void GenerateCall::OnDone(const grpc::Status& status) {
  const Clock::time_point end = Clock::now();
  RequestRecord record = std::move(record_);
  record.code = client::StatusCodeName(status.error_code());
  if (!status.ok()) record.error_message = status.error_message();
  StreamTiming timing = std::move(timing_);
  std::shared_ptr<RunState> state = std::move(state_);
  const PromptSpec spec = std::move(spec_);
  const std::vector<int32_t> output = std::move(output_);
  delete this;  // OnDone is the call's last reaction
  FinishCall(state, std::move(record), std::move(timing), end, &spec, &output);
}

// Open loop: starts calls at Poisson arrival times (the first at once) until sending ends.
void Dispatch(const std::shared_ptr<RunState>& state, uint64_t seed) {
  PoissonArrivals arrivals(state->load.rate, seed);
  Clock::time_point next = state->run_start;
  while (true) {
    // Sleep in slices so that an interrupt ends a long gap early.
    for (Clock::time_point now = Clock::now(); now < next && !state->Interrupted();
         now = Clock::now()) {
      std::this_thread::sleep_until(std::min(next, now + std::chrono::milliseconds(50)));
    }
    if (!MaybeSend(state, next)) return;
    next += std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(arrivals.NextGapSeconds()));
  }
}

RunProgress Snapshot(const RunState& state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mu) {
  RunProgress p;
  p.sent = std::max<int64_t>(0, state.sent - state.limits.warmup_requests);
  p.finished = state.measured_finished;
  p.failed = state.measured_failed;
  p.in_flight = state.in_flight;
  p.total = state.limits.num_requests;
  p.duration_s = absl::ToDoubleSeconds(state.limits.duration);
  if (state.measure_start.has_value())
    p.elapsed_s = MsBetween(*state.measure_start, Clock::now()) / 1e3;
  p.output_tokens = state.measured_tokens.load();
  return p;
}

}  // namespace

LoadRunner::LoadRunner(const client::ClientChannel* channel, v1::GenerateRequest request_template)
    : channel_(channel),
      stub_(v1::TextGeneration::NewStub(channel->channel())),
      template_(std::move(request_template)) {}

RunResult LoadRunner::Run(const LoadSpec& load, const RunLimits& limits, Workload* workload,
                          uint64_t seed, const std::atomic<bool>* interrupt,
                          const std::function<void(const RunProgress&)>& on_progress) {
  auto state = std::make_shared<RunState>();
  state->channel = channel_;
  state->stub = stub_;
  state->request_template = &template_;
  state->load = load;
  state->limits = limits;
  state->interrupt = interrupt;
  state->http = http_.has_value() ? &*http_ : nullptr;
  {
    absl::MutexLock lock(&state->mu);
    state->workload = workload;
  }
  state->run_start = Clock::now();
  std::thread dispatcher;
  if (load.mode == LoadSpec::Mode::kClosed) {
    for (int i = 0; i < load.concurrency && MaybeSend(state); ++i) {
    }
  } else {
    dispatcher = std::thread(Dispatch, state, seed);
  }
  std::vector<RequestRecord> records;
  double max_send_lag_ms = 0;
  const absl::Condition done_condition(
      +[](RunState* s) ABSL_NO_THREAD_SAFETY_ANALYSIS { return s->Done(); }, state.get());
  for (bool done = false; !done;) {
    RunProgress progress;
    {
      absl::MutexLock lock(&state->mu);
      done = state->mu.AwaitWithTimeout(done_condition, absl::Milliseconds(100));
      progress = Snapshot(*state);
      if (done) {
        records = std::move(state->records);
        max_send_lag_ms = state->max_send_lag_ms;
      }
    }
    if (on_progress) on_progress(progress);  // without the lock: it writes to a terminal
  }
  if (dispatcher.joinable()) dispatcher.join();
  return Aggregate(load, records, max_send_lag_ms, state->Interrupted());
}

}  // namespace dcf::loadgen
