// The serving engine: continuous batching over one backend, owned by a single engine loop
// thread. Transport-free: the gRPC server, the benchmark and the tests all drive it through
// this interface.
//
// Thread-safety: Enqueue, EnqueueAll, Cancel, Stats, Shutdown and the accessors are safe from
// any thread; they only touch the request queue under a mutex. The scheduler, the KV cache and
// the backend are touched only by the engine loop thread.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "engine/execution/backend.h"
#include "engine/serving/request.h"
#include "engine/serving/request_stream.h"
#include "engine/serving/request_validator.h"
#include "engine/serving/sequence.h"

namespace dcf {

class Tokenizer;

// Pipelined steps (docs/DESIGN.md "Pipelined steps"): step n + 1 is planned and launched
// before the results of step n are waited for, its decode tokens chained to what step n is
// still sampling (step_batch.h), so the host's work between steps (results, stop rules,
// streams, scheduling, packing) overlaps the device's. Outputs are those of serial steps, up to
// batch composition (bit for bit on the CPU; 16-bit weights on a GPU may sample a near-tie
// differently, as two serial runs whose batches form differently may). On the CPU, which
// computes a step at Launch, it overlaps nothing and delays every token by one step.
enum class PipelineSteps {
  kAuto,  // on where Launch returns before the device is done (cuda, cuda-sim), else off
  kOn,    // on wherever the backend chains steps (Backend::ChainsSteps; else off, logged)
  kOff,   // one step at a time: Launch, Wait, results, then the next step is planned
};
// "auto", "on", "off" (the server's and dcformer-bench's --pipeline-steps); InvalidArgument
// otherwise.
absl::StatusOr<PipelineSteps> ParsePipelineSteps(absl::string_view name);
const char* PipelineStepsName(PipelineSteps mode);

// Bounds of the speculative-decoding options (ValidateEngineOptions; the server checks its
// flags against them too): a draft of more than kMaxSpecTokens tokens is never memory-bound,
// and the proposer keeps one index per n-gram length and hashes O(max^2) per token.
inline constexpr int kMaxSpecTokens = 64;
inline constexpr int kMaxSpecNgram = 32;

// The KV pool is sized once at Create: see kv_cache_planner.h for how the budget is split
// between the global and the window layer group. Scheduling rules (admission, watermark,
// chunked prefill, preemption) are documented in scheduler.h.
struct EngineOptions {
  int block_size = 16;                 // tokens per KV block
  size_t kv_cache_bytes = 0;           // KV memory budget; 0 = use kv_cache_fraction
  double kv_cache_fraction = 0.25;     // of the memory the backend reports available after
                                       // weights and workspace (Backend::Prepare): free
                                       // device memory, or host memory within the cgroup limit
  int max_num_seqs = 64;               // running sequences per step (clamped to the token budget)
  int max_num_batched_tokens = 512;    // token budget per step (decode + prefill chunks)
  int max_queued_requests = 256;       // waiting requests beyond this: ResourceExhausted
  int64_t max_queued_prompt_tokens = 1 << 20;  // total prompt tokens waiting
  int max_prompt_tokens = 0;           // 0 = model context (never more than it)
  int max_new_tokens_limit = 0;        // 0 = model context (never more than it)
  int default_max_new_tokens = 256;    // requests that leave max_new_tokens unset (>= 1)
  double watermark = 0.01;             // fraction of blocks kept free when admitting
  int max_prefill_chunk_tokens = 0;    // tokens per prefill chunk; 0 = up to the step budget
  // Automatic prefix caching (kv_cache_manager.h): full blocks are named by a hash of their
  // tokens (and the request's cache_salt) and reused by later requests with that prefix.
  bool prefix_caching = true;
  // Speculative decoding by prompt lookup (ngram_proposer.h, docs/DESIGN.md "Speculative
  // decoding"): each decoding sequence may verify up to spec_tokens drafted tokens per step;
  // 0 = off. Needs a backend that VerifiesDrafts() (else off, with a log line). The output is
  // identical to plain decoding's. Window layers cap the draft at window_size - 2 without
  // prefix caching.
  int spec_tokens = 0;                 // [0, kMaxSpecTokens]
  int spec_ngram_min = 2;              // suffix lengths matched, [1, spec_ngram_max]
  int spec_ngram_max = 4;              // at most kMaxSpecNgram
  // Drafted tokens verified per step, all sequences together (0: 4 * spec_tokens). Steps
  // stay memory-bound while small; beyond this, drafts are left out.
  int spec_max_step_drafts = 0;
  // Tokens a step may hold, decodes and prefill chunks included, for drafts to be added to
  // it: drafts only fill a step up to here. 0: measured by the backend at Create
  // (Backend::MeasureMemoryBoundTokens: the largest step still bound by reading the weights);
  // no cap where the backend does not measure (cuda). 1 (given or measured) turns
  // speculation off. Speculation off: unused.
  int spec_step_tokens = 0;
  // Per sequence, shrink the draft after low acceptance and pause drafting for a while
  // after repeated misses (engine_loop.cc, SpecFeedback); false: always draft spec_tokens (tests).
  bool spec_adaptive = true;
  // Pipelined steps (above). Steps of a sequence that may draft (speculative decoding) run
  // serially: its proposer needs its real last token. Engine::options() holds the mode in
  // effect (kOn or kOff).
  PipelineSteps pipeline_steps = PipelineSteps::kAuto;
  // Exact pool sizes per group (global, window), bypassing the budget (tests, benchmarks).
  // Both 0 (the default): size from kv_cache_bytes / kv_cache_fraction, see kv_cache_planner.h.
  std::array<int, kNumLayerGroups> kv_num_blocks{0, 0};
};

// Counters and gauges for metrics; a consistent snapshot.
struct EngineStats {
  int num_waiting = 0;
  int num_running = 0;
  int64_t num_preemptions = 0;
  int64_t steps = 0;
  std::array<int, kNumLayerGroups> kv_blocks_total{0, 0};
  std::array<int, kNumLayerGroups> kv_blocks_used{0, 0};
  size_t kv_cache_bytes = 0;           // memory of the whole KV pool
  bool prefix_caching = false;         // EngineOptions::prefix_caching
  // Blocks that hold a cached prefix (in use or free), and cached blocks evicted so far.
  std::array<int, kNumLayerGroups> kv_blocks_cached{0, 0};
  std::array<int64_t, kNumLayerGroups> prefix_cache_evictions{0, 0};
  // Admissions (readmissions after preemption included): tokens looked up in the prefix
  // cache (each sequence's known tokens) and tokens found there.
  int64_t prefix_cache_queries = 0;
  int64_t prefix_cache_hits = 0;
  bool loop_alive = false;
  absl::Time last_progress;            // last time the loop finished a step or idled
  int64_t tokens_generated = 0;        // sampled tokens, all requests
  // Speculative decoding: drafted tokens verified, and those accepted (they equal what was
  // sampled); the share accepted is the acceptance rate.
  int64_t spec_drafted_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  int spec_tokens = 0;                 // the draft length in effect (0: off)
  // The step token budget of the drafts in effect (EngineOptions::spec_step_tokens, given or
  // measured; 0: no cap, or speculation off).
  int spec_step_tokens = 0;
  int64_t prompt_tokens_computed = 0;  // prefill tokens run (recomputation included)
  bool pipelining = false;             // pipelined steps in effect (EngineOptions)
  // Pipelined steps: steps launched before the previous one was waited for, and the tokens
  // of their chunks that were computed for a request that had ended meanwhile (a stop rule,
  // a cancellation), whose results were dropped.
  int64_t chained_steps = 0;
  int64_t pipeline_dropped_tokens = 0;
  bool healthy = true;                 // false once a backend step failed (fatal)
  std::string failure;                 // the failure's message when !healthy
  BackendInfo backend;
};

// Callbacks for metrics, run on the engine loop thread; must be cheap and never block.
class EngineObserver {
 public:
  virtual ~EngineObserver() = default;
  // A step's results were processed. `step_time` runs from its planning, or from the end of
  // the step reported before when that is later (pipelined steps: the step was planned while
  // the one before was on the device), to now: the reported times never overlap, so their sum
  // is at most the time the loop spent, and pipelined or not each one is a step's share.
  virtual void OnStep(int num_seqs, int num_tokens, int num_prefill_tokens,
                      absl::Duration step_time) {}
  virtual void OnPreemption() {}
  // A sequence verified `drafted` tokens in a step and `accepted` of them were accepted.
  virtual void OnSpecVerify(int drafted, int accepted) {}
  // A sequence was admitted with prefix caching on (again after a preemption too): it looked
  // up `query_tokens` tokens and found `hit_tokens` of them cached.
  virtual void OnPrefixCacheQuery(int query_tokens, int hit_tokens) {}
  // `origin` is the request's GenerationRequest::origin.
  virtual void OnFirstToken(int origin, absl::Duration ttft) {}
  virtual void OnInterTokenLatency(int origin, absl::Duration itl) {}
  // A request ended because its logits were not finite (NaN or infinity: broken weights or
  // an overflow); it also reaches OnFinished, with kError.
  virtual void OnNonFiniteLogits() {}
  virtual void OnFinished(int origin, const GenerationChunk& final_chunk) {}
};

namespace engine_internal {
class EngineImpl;
}  // namespace engine_internal

// Cancels one request from any thread; copyable, and harmless once the request finished or
// the engine is gone (it refers to both weakly).
class RequestCanceller {
 public:
  RequestCanceller() = default;
  void Cancel() const;

 private:
  friend class RequestHandle;
  RequestCanceller(std::weak_ptr<engine_internal::EngineImpl> engine,
                   std::weak_ptr<RequestStream> stream)
      : engine_(std::move(engine)), stream_(std::move(stream)) {}
  std::weak_ptr<engine_internal::EngineImpl> engine_;
  std::weak_ptr<RequestStream> stream_;
};

// RAII owner of one request: destroying it cancels the request if it is still running.
// A handle may outlive its Engine: it refers to the engine weakly, and once the engine is
// gone Cancel() and the destructor do nothing (the engine cancelled everything when it shut
// down). The stream stays readable. Not thread-safe itself (one owner), but different
// handles may be used from different threads.
class RequestHandle {
 public:
  RequestHandle() = default;
  RequestHandle(RequestHandle&&) = default;
  RequestHandle& operator=(RequestHandle&&);
  ~RequestHandle();

  RequestStream& stream() const { return *stream_; }
  const std::shared_ptr<RequestStream>& shared_stream() const { return stream_; }
  void Cancel();
  RequestCanceller canceller() const { return RequestCanceller(engine_, stream_); }

 private:
  friend class Engine;
  RequestHandle(std::weak_ptr<engine_internal::EngineImpl> engine,
                std::shared_ptr<RequestStream> stream)
      : engine_(std::move(engine)), stream_(std::move(stream)) {}

  std::weak_ptr<engine_internal::EngineImpl> engine_;
  std::shared_ptr<RequestStream> stream_;
};

class Engine {
 public:
  // Sizes the KV cache from the options, allocates it in the backend and starts the engine
  // loop thread, which runs every step. The calling thread's idle OpenMP workers (those that
  // loaded the model) are ended first (ReleaseIdleComputeThreads, compute_threads.h).
  // `tokenizer` may be null (then requests cannot ask for text or stop strings); `observer`
  // may be null. Neither is owned; both must outlive the engine.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(std::unique_ptr<Backend> backend,
                                                        const Tokenizer* tokenizer,
                                                        const EngineOptions& options,
                                                        EngineObserver* observer = nullptr);
  ~Engine();  // Shutdown()

  // A failed backend step (Backend::Launch/Wait error) is fatal: every request in flight
  // finishes with kError (INTERNAL), new requests get Unavailable, and Stats() reports
  // healthy = false, so the server turns NOT_SERVING and the orchestrator restarts it.
  // Logits that are not finite are not a backend failure: only the request they belong to
  // ends, with kError and an Internal status that says so (EngineObserver::OnNonFiniteLogits).

  // Validates and queues a request. Errors (nothing is queued then):
  //   InvalidArgument: bad sampling/stopping/output values, empty prompt, token id outside
  //     the vocabulary, text/stop strings without a tokenizer; the message names the field.
  //   OutOfRange: prompt + max_new_tokens exceeds the context or the whole KV pool, or the
  //     prompt alone exceeds the waiting queue's token limit (CheckQueueable).
  //   ResourceExhausted: the waiting queue is full (immediately, never after a wait).
  //   Unavailable: the engine is shutting down or draining.
  absl::StatusOr<RequestHandle> Enqueue(GenerationRequest request);

  // Validates and queues `requests` as one group (the n choices of one OpenAI request): all
  // of them or none, so a group never holds part of the queue while it is refused. Errors
  // (nothing is queued then): Enqueue's, of the first request that has one, with *failed
  // (when not null) set to its index; or the group's, with *failed set to -1: CheckQueueable's
  // OutOfRange, or ResourceExhausted when the waiting queue has no room for all of them now.
  absl::StatusOr<std::vector<RequestHandle>> EnqueueAll(std::vector<GenerationRequest> requests,
                                                        int* failed = nullptr);

  // The waiting queue's limits (max_queued_requests, max_queued_prompt_tokens) against
  // requests that would wait together, with nothing else waiting: OutOfRange when one prompt
  // alone (*failed: its index, message naming prompt_tokens) or all of them together
  // (*failed: -1, message naming "requests") exceed them, since such requests can never be
  // queued, however long one waits; OK otherwise. Enqueue and EnqueueAll refuse the same.
  // Reads only the options: a caller may ask before it spends anything on the requests.
  absl::Status CheckQueueable(absl::Span<const GenerationRequest> requests,
                              int* failed = nullptr) const;

  // Cancels the request whose stream has `request_key` (RequestStream::key(); client ids
  // need not be unique, so cancellation never goes by them). Its blocks are freed within one
  // step and its stream gets a final chunk with kCancelled. Unknown or finished keys are
  // ignored, so a late cancel can never hit another request.
  void Cancel(uint64_t request_key);

  // New requests get Unavailable; running and queued ones continue.
  void StopAccepting();
  // Cancels everything, stops the loop thread and joins it. Idempotent.
  void Shutdown();

  EngineStats Stats() const;  // Stats().backend says what the backend is
  const ModelConfig& config() const;
  const EngineOptions& options() const;
  // What requests may ask for, resolved from the options, the model and the tokenizer
  // (including the EOS generation stops at). Fixed at Create.
  const RequestLimits& limits() const;

  // Test-only: runs `hook` on the engine loop thread after every step (blocks committed, the
  // step's sampled tokens appended, finished sequences removed) with the KV manager and the
  // running sequences. With pipelined steps a step is then in flight: its sequences' tokens
  // end with its pending tokens (Sequence::num_pending) and its blocks are committed. Set it
  // before enqueueing; it must not call into the engine.
  using StepHook =
      std::function<void(const KvCacheManager& kv, const std::vector<const Sequence*>& running)>;
  void SetStepHookForTesting(StepHook hook);

 private:
  explicit Engine(std::shared_ptr<engine_internal::EngineImpl> impl);
  // Shared only so that RequestHandles can refer to it weakly.
  std::shared_ptr<engine_internal::EngineImpl> impl_;
};

}  // namespace dcf
