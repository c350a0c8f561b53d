// dcformer-bench: drives the serving engine in-process with N concurrent greedy requests and
// reports throughput, time to first token and inter-token latency for
//   (a) continuous batching: all requests enqueued at once;
//   (b) the same requests one at a time (each enqueued when the previous one finished);
// and the throughput ratio a / b. Prompt and generation lengths are drawn uniformly from the
// flag ranges and clamped to the model context (prompt <= context / 2, prompt + new <= context).
// TTFT in (b) counts from the request's own enqueue, not from the start of the run.
// With --profile (cpu backend) it also prints where the time of (a)'s steps goes, for
// decode-only steps and for steps with prefill tokens separately: the backend's phases (cpu_profile.h), the engine's own work inside a step
// (scheduling, building the batch, stop checks, detokenization) and the loop's work between
// steps (publishing chunks to the request streams).
// Each run prints its steps and time per step, with --pipeline-steps (auto|on|off) and how
// many steps were chained. With --zero_cost_steps the backend answers every step at once
// (no model): the time per step is then the host's own work per step (engine and the
// backends' shared host-side plan), which pipelined steps hide behind a device's step.
//
//   dcformer-bench [--model_dir=DIR | --random_model_context=2048] [--num_requests=32] ...
#include <algorithm>
#include <array>
#include <optional>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <random>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "engine/common/file_util.h"
#include "engine/common/flag_names.h"
#include "engine/common/logging.h"
#include "engine/common/status_macros.h"
#include "engine/backends/backend_factory.h"
#include "engine/backends/backend_flags.h"
#include "engine/cpu/cpu_backend.h"
#include "engine/cpu/fma_throughput.h"
#include "engine/execution/step_plan.h"
#include "engine/model/random_model.h"
#include "engine/serving/engine.h"
#include "engine/tokenizer/tokenizer.h"

ABSL_FLAG(std::string, model_dir, DCF_DEFAULT_BENCH_MODEL_DIR, "model directory");
ABSL_FLAG(int, random_model_context, 0,
          "if > 0: write a random model (dim 128, 4 layers, 8 heads, vocab 300, window 16) with "
          "this context to a temporary directory and use it instead of --model_dir");
ABSL_FLAG(int, num_requests, 32, "requests");
ABSL_FLAG(int, min_prompt, 32, "shortest prompt (tokens)");
ABSL_FLAG(int, max_prompt, 512, "longest prompt (tokens)");
ABSL_FLAG(int, min_new, 64, "fewest new tokens");
ABSL_FLAG(int, max_new, 256, "most new tokens");
ABSL_FLAG(int, max_num_seqs, 64, "EngineOptions::max_num_seqs");
ABSL_FLAG(int, max_num_batched_tokens, 512, "EngineOptions::max_num_batched_tokens");
ABSL_FLAG(int, max_prefill_chunk, 0, "EngineOptions::max_prefill_chunk_tokens");
ABSL_FLAG(int64_t, kv_cache_mb, 0, "KV cache budget in MiB (0: the default fraction)");
ABSL_FLAG(bool, prefix_caching, true, "EngineOptions::prefix_caching (--noprefix_caching: off)");
ABSL_FLAG(uint64_t, seed, 1, "seed of the request lengths and prompts");
ABSL_FLAG(int, spec_tokens, 0, "EngineOptions::spec_tokens (speculative decoding; 0 = off)");
ABSL_FLAG(int, spec_ngram_min, 2, "EngineOptions::spec_ngram_min");
ABSL_FLAG(int, spec_ngram_max, 4, "EngineOptions::spec_ngram_max");
ABSL_FLAG(bool, spec_adaptive, true, "EngineOptions::spec_adaptive");
ABSL_FLAG(int, spec_step_tokens, 0,
          "EngineOptions::spec_step_tokens (drafts fill a step up to this many tokens; 0 = "
          "measured by the backend)");
ABSL_FLAG(std::string, pipeline_steps, "auto",
          "EngineOptions::pipeline_steps: auto (on for cuda and cuda-sim, off for cpu), on, off");
ABSL_FLAG(int, copy_phrase, 0,
          "if > 0: each prompt is a random phrase of this many tokens repeated to its length (a "
          "copy-heavy workload for speculative decoding); 0: random tokens");
ABSL_FLAG(std::string, copy_text, "",
          "a text file (e.g. tests/data/kjv/heldout.txt): each prompt is a passage of it "
          "(tokenized with the model directory's tokenizer, from a random line) followed by the "
          "passage's first eighth again, so the answer that repeats the passage is a copy "
          "('rewrite this passage'); max new tokens are the rest of the passage at most. "
          "Overrides --copy_phrase");
ABSL_FLAG(bool, skip_sequential, false, "only run (a)");
ABSL_FLAG(bool, profile, false,
          "print the time breakdown of (a)'s steps, decode-only and with prefill (cpu backend)");

ABSL_FLAG(bool, zero_cost_steps, false,
          "steps cost nothing: the backend answers every step at once (its shared host-side "
          "checks and plan run, no model; sampled tokens are a fixed function of the "
          "position), so a run's time per step is the host's own work per step: what "
          "--pipeline-steps hides behind a device's step");

ABSL_FLAG(bool, fma_peak, false,
          "measure the fp32 FMA peak (engine/cpu/fma_throughput.h) before and after the run, "
          "to state compute-bound phases (prefill) against the peak of the same run");

namespace dcf {
namespace {

void PrintFmaPeak(const char* when) {
  const FmaThroughput one = MeasureFmaThroughput(1);
  const FmaThroughput all =
      MeasureFmaThroughput(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  std::printf("FMA peak %s (fp32, %s): %.1f GFLOP/s with 1 thread, %.1f GFLOP/s with %d\n", when,
              all.isa, one.gflop_per_s, all.gflop_per_s, all.threads);
}

// --zero_cost_steps: answers every step at once from the host. What a backend's Launch does
// on the host for every step (ValidateStepBatch, PlanLogitRows, the slots a next step may
// chain) runs; nothing is computed: each sampled slot gets (position * 7 + 3) % vocab, so
// requests run to max_new_tokens (no tokenizer, no EOS). Chains steps like a device backend
// (two results kept), so both --pipeline-steps modes run. The inner backend is kept for its
// config, memory sizes and cache.
class ZeroCostBackend final : public Backend {
 public:
  explicit ZeroCostBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  const ModelConfig& config() const override { return inner_->config(); }
  BackendInfo info() const override {
    BackendInfo i = inner_->info();
    i.name += " (zero-cost steps)";
    return i;
  }
  size_t BytesPerBlock(LayerGroup g, int b) const override { return inner_->BytesPerBlock(g, b); }
  absl::StatusOr<size_t> Prepare(const StepLimits& limits) override {
    limits_ = limits;
    return inner_->Prepare(limits);
  }
  absl::Status AllocateCache(const KvCacheShape& shape) override {
    shape_ = shape;
    return inner_->AllocateCache(shape);
  }
  absl::Status SetPenaltyState(int, absl::Span<const int32_t>, absl::Span<const int32_t>) override {
    return absl::OkStatus();
  }
  absl::Status Launch(const StepBatch& batch) override {
    if (in_flight_ == 2) return absl::FailedPreconditionError("2 steps in flight");
    RETURN_IF_ERROR(ValidateStepBatch(batch, config(), shape_, limits_));
    const LogitRows plan = PlanLogitRows(batch);
    chainable_ = ChainableSlots(batch);  // what a chaining backend keeps for the next step
    const std::vector<int32_t> slots = batch.slot_offsets();
    StepOutput& out = results_[(oldest_ + in_flight_) % 2];
    out.Resize(slots.back(), 0, config().vocab_size);
    for (int s : plan.sampled_seqs) {
      const int pos = batch.positions[batch.seq_offsets[s + 1] - 1];
      out.tokens[slots[s]] = (pos * 7 + 3) % config().vocab_size;
    }
    ++in_flight_;
    return absl::OkStatus();
  }
  absl::Status Wait(StepOutput* out) override {
    if (in_flight_ == 0) return absl::FailedPreconditionError("Wait without a Launch");
    std::swap(*out, results_[oldest_]);
    oldest_ = (oldest_ + 1) % 2;
    --in_flight_;
    return absl::OkStatus();
  }
  bool ChainsSteps() const override { return true; }
  bool LaunchReturnsEarly() const override { return true; }

 private:
  std::unique_ptr<Backend> inner_;
  StepLimits limits_;
  KvCacheShape shape_;
  std::array<StepOutput, 2> results_;
  int oldest_ = 0, in_flight_ = 0;
  std::vector<int32_t> chainable_;
};

struct Workload {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int> max_new;
  int64_t total_new = 0;
};

// The token ids of the --copy_text file and where each of its lines starts.
struct CopyText {
  std::vector<int32_t> ids;
  std::vector<size_t> line_starts;
};

absl::StatusOr<CopyText> LoadCopyText(const std::string& path, const std::string& model_dir) {
  ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, Tokenizer::FromModelDir(model_dir));
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  CopyText out;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer->Encode(absl::StrCat(line, "\n")));
    out.line_starts.push_back(out.ids.size());
    out.ids.insert(out.ids.end(), ids.begin(), ids.end());
  }
  if (out.ids.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " holds no text"));
  return out;
}

absl::StatusOr<Workload> MakeWorkload(const ModelConfig& c, const std::string& model_dir) {
  std::optional<CopyText> copy_text;
  if (const std::string path = absl::GetFlag(FLAGS_copy_text); !path.empty()) {
    ASSIGN_OR_RETURN(copy_text, LoadCopyText(path, model_dir));
  }
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  const auto uniform = [&](int lo, int hi) {
    return lo + static_cast<int>(rng() % static_cast<uint64_t>(std::max(1, hi - lo + 1)));
  };
  Workload w;
  for (int i = 0; i < absl::GetFlag(FLAGS_num_requests); ++i) {
    int p = uniform(absl::GetFlag(FLAGS_min_prompt), absl::GetFlag(FLAGS_max_prompt));
    int n = uniform(absl::GetFlag(FLAGS_min_new), absl::GetFlag(FLAGS_max_new));
    p = std::max(1, std::min(p, c.max_positions / 2));
    n = std::max(1, std::min(n, c.max_positions - p));
    std::vector<int32_t> prompt(p);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % c.vocab_size);
    const int phrase = absl::GetFlag(FLAGS_copy_phrase);
    for (int k = phrase; phrase > 0 && k < p; ++k) prompt[k] = prompt[k - phrase];
    if (copy_text.has_value()) {
      // A passage of L tokens, then its first m again: the answer repeats passage[m, L).
      const int m = std::max(1, p / 8);
      const int len = p - m;
      if (static_cast<size_t>(len) > copy_text->ids.size()) {
        return absl::InvalidArgumentError("--copy_text: the file is shorter than a prompt");
      }
      size_t start = 0;
      do {
        start = copy_text->line_starts[rng() % copy_text->line_starts.size()];
      } while (start + len > copy_text->ids.size());
      for (int k = 0; k < p; ++k) prompt[k] = copy_text->ids[start + (k < len ? k : k - len)];
      n = std::max(1, std::min(n, len - m));
    }
    w.prompts.push_back(std::move(prompt));
    w.max_new.push_back(n);
    w.total_new += n;
  }
  return w;
}

// Collects latencies from the engine loop (the only caller).
class Recorder : public EngineObserver {
 public:
  // Decode-only steps are profiled when `cpu` is set (it must outlive the run).
  void set_cpu(const CpuBackend* cpu) { cpu_ = cpu; }
  void OnFirstToken(int, absl::Duration ttft) override {
    absl::MutexLock l(&mu_);
    ttft_ms_.push_back(absl::ToDoubleMilliseconds(ttft));
  }
  void OnInterTokenLatency(int, absl::Duration itl) override {
    absl::MutexLock l(&mu_);
    itl_ms_.push_back(absl::ToDoubleMilliseconds(itl));
  }
  void OnPreemption() override {
    absl::MutexLock l(&mu_);
    ++preemptions_;
  }
  void OnStep(int num_seqs, int num_tokens, int num_prefill_tokens,
              absl::Duration step_time) override {
    absl::MutexLock l(&mu_);
    ++steps_;
    seqs_ += num_seqs;
    // The engine loop thread's CPU time (OnStep runs on it): its work per step, which other
    // processes' load does not inflate as it does wall time.
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    const double cpu = static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
    if (!loop_cpu_first_.has_value()) loop_cpu_first_ = cpu;
    loop_cpu_last_ = cpu;
    const absl::Time now = absl::Now();
    if (cpu_ != nullptr) {
      // The profile advanced by exactly this step (OnStep runs on the engine loop thread).
      const cpu::CpuStepProfile& p = cpu_->profile();
      if (last_step_end_.has_value()) {
        StepStats& st = num_prefill_tokens == 0 ? decode_ : prefill_;
        for (int i = 0; i < cpu::CpuStepProfile::kNumPhases; ++i) {
          st.phases[i] += p.seconds[i] - last_profile_.seconds[i];
        }
        st.backend_s += p.Total() - last_profile_.Total();
        st.step_s += absl::ToDoubleSeconds(step_time);
        // From the end of the previous step to the start of this one: publishing chunks to
        // the streams, waiting for work, bookkeeping. About 0 with pipelined steps, whose
        // times run from the end of the one before (EngineObserver::OnStep).
        st.between_s += absl::ToDoubleSeconds(now - step_time - *last_step_end_);
        st.seqs += num_seqs;
        st.tokens += num_tokens;
        ++st.steps;
      }
      last_profile_ = p;
    }
    last_step_end_ = now;
  }
  void Report(const char* name, double seconds, int64_t tokens) {
    absl::MutexLock l(&mu_);
    std::printf("%-22s %8.1f tok/s  %6.2f s  %lld tokens  steps %lld  mean batch %.1f  "
                "preemptions %lld\n",
                name, tokens / seconds, seconds, static_cast<long long>(tokens),
                static_cast<long long>(steps_), steps_ ? static_cast<double>(seqs_) / steps_ : 0.0,
                static_cast<long long>(preemptions_));
    if (steps_ > 1) {
      std::printf("  engine loop thread: %.1f us of CPU per step\n",
                  1e6 * (loop_cpu_last_ - *loop_cpu_first_) / static_cast<double>(steps_ - 1));
    }
    PrintPercentiles("  TTFT ms", ttft_ms_);
    PrintPercentiles("  ITL  ms", itl_ms_);
    Print("decode-only steps", decode_);
    Print("steps with prefill", prefill_);
  }

 private:
  static void PrintPercentiles(const char* name, std::vector<double> v) {
    if (v.empty()) return;
    std::sort(v.begin(), v.end());
    const auto q = [&](double p) { return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))]; };
    std::printf("%s  p50 %8.2f  p90 %8.2f  p99 %8.2f  max %8.2f  (n=%zu)\n", name, q(0.5), q(0.9),
                q(0.99), v.back(), v.size());
  }
  absl::Mutex mu_;
  std::vector<double> ttft_ms_ ABSL_GUARDED_BY(mu_);
  std::vector<double> itl_ms_ ABSL_GUARDED_BY(mu_);
  int64_t preemptions_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t steps_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t seqs_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<double> loop_cpu_first_ ABSL_GUARDED_BY(mu_);  // seconds, at the first step
  double loop_cpu_last_ ABSL_GUARDED_BY(mu_) = 0;
  // Time of a class of steps (decode-only, or with prefill tokens).
  struct StepStats {
    std::array<double, cpu::CpuStepProfile::kNumPhases> phases{};
    double backend_s = 0, step_s = 0, between_s = 0;
    int64_t seqs = 0, tokens = 0, steps = 0;
  };
  static void Print(const char* what, const StepStats& st) {
    if (st.steps == 0) return;
    const double n = static_cast<double>(st.steps);
    const double total = st.step_s + st.between_s;
    std::printf("%s: %lld, mean %.1f sequences and %.1f tokens, %.2f ms per step (in step "
                "%.2f, between steps %.2f)\n",
                what, static_cast<long long>(st.steps), st.seqs / n, st.tokens / n,
                1e3 * total / n, 1e3 * st.step_s / n, 1e3 * st.between_s / n);
    const auto row = [&](const char* name, double s) {
      std::printf("  %-28s %8.3f ms  %5.1f%%\n", name, 1e3 * s / n, 100.0 * s / total);
    };
    for (int i = 0; i < cpu::CpuStepProfile::kNumPhases; ++i) {
      row(cpu::CpuStepProfile::Name(i), st.phases[i]);
    }
    row("engine: schedule+batch+stops", st.step_s - st.backend_s);
    row("engine: streams+loop", st.between_s);
  }
  const CpuBackend* cpu_ = nullptr;
  cpu::CpuStepProfile last_profile_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Time> last_step_end_ ABSL_GUARDED_BY(mu_);
  StepStats decode_ ABSL_GUARDED_BY(mu_);
  StepStats prefill_ ABSL_GUARDED_BY(mu_);
};

GenerationRequest MakeRequest(const Workload& w, size_t i) {
  GenerationRequest r;
  r.prompt_tokens = w.prompts[i];
  r.sampling.temperature = 0;
  r.stopping.max_new_tokens = w.max_new[i];
  r.output.text = false;
  return r;
}

int64_t Drain(RequestStream& s) {
  int64_t n = 0;
  GenerationChunk c;
  while (!s.done()) {
    s.WaitTake(&c);
    n += c.tokens.size();
  }
  return n;
}

absl::StatusOr<double> RunOnce(const std::string& dir, const Workload& w, bool batched,
                               Recorder* rec, int64_t* tokens) {
  ASSIGN_OR_RETURN(BackendOptions backend_options, BackendOptionsFromFlags());
  auto model = LoadModel(dir, backend_options);
  if (!model.ok()) return model.status();
  EngineOptions o;
  o.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  o.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  o.max_prefill_chunk_tokens = absl::GetFlag(FLAGS_max_prefill_chunk);
  o.kv_cache_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_kv_cache_mb)) << 20;
  o.prefix_caching = absl::GetFlag(FLAGS_prefix_caching);
  o.spec_tokens = absl::GetFlag(FLAGS_spec_tokens);
  o.spec_ngram_min = absl::GetFlag(FLAGS_spec_ngram_min);
  o.spec_ngram_max = absl::GetFlag(FLAGS_spec_ngram_max);
  o.spec_adaptive = absl::GetFlag(FLAGS_spec_adaptive);
  o.spec_step_tokens = absl::GetFlag(FLAGS_spec_step_tokens);
  ASSIGN_OR_RETURN(o.pipeline_steps, ParsePipelineSteps(absl::GetFlag(FLAGS_pipeline_steps)));
  o.max_queued_requests = std::max(o.max_queued_requests, static_cast<int>(w.prompts.size()));
  if (batched && absl::GetFlag(FLAGS_profile)) {
    rec->set_cpu(dynamic_cast<const CpuBackend*>(model->backend.get()));
  }
  std::unique_ptr<Backend> backend = std::move(model->backend);
  if (absl::GetFlag(FLAGS_zero_cost_steps)) {
    backend = std::make_unique<ZeroCostBackend>(std::move(backend));
  }
  auto engine = Engine::Create(std::move(backend), nullptr, o, rec);
  if (!engine.ok()) return engine.status();
  *tokens = 0;
  const absl::Time t0 = absl::Now();
  if (batched) {
    std::vector<RequestHandle> handles;
    for (size_t i = 0; i < w.prompts.size(); ++i) {
      auto h = (*engine)->Enqueue(MakeRequest(w, i));
      if (!h.ok()) return h.status();
      handles.push_back(std::move(*h));
    }
    for (auto& h : handles) *tokens += Drain(h.stream());
  } else {
    for (size_t i = 0; i < w.prompts.size(); ++i) {
      auto h = (*engine)->Enqueue(MakeRequest(w, i));
      if (!h.ok()) return h.status();
      *tokens += Drain(h->stream());
    }
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  const EngineStats st = (*engine)->Stats();
  std::printf("  pipelined steps %s: %lld steps, %lld chained, %lld tokens dropped; %.1f us per "
              "step%s\n",
              st.pipelining ? "on" : "off", static_cast<long long>(st.steps),
              static_cast<long long>(st.chained_steps),
              static_cast<long long>(st.pipeline_dropped_tokens),
              st.steps > 0 ? 1e6 * seconds / st.steps : 0.0,
              absl::GetFlag(FLAGS_zero_cost_steps) ? " (zero-cost steps: the host's work alone)"
                                                   : "");
  if (st.spec_tokens > 0) {
    std::printf("  speculative decoding k=%d: %lld drafted, %lld accepted (acceptance %.1f%%), "
                "%lld steps\n",
                st.spec_tokens, static_cast<long long>(st.spec_drafted_tokens),
                static_cast<long long>(st.spec_accepted_tokens),
                st.spec_drafted_tokens > 0
                    ? 100.0 * st.spec_accepted_tokens / st.spec_drafted_tokens
                    : 0.0,
                static_cast<long long>(st.steps));
  }
  return seconds;
}

int Main() {
  std::string dir = absl::GetFlag(FLAGS_model_dir);
  const int random_context = absl::GetFlag(FLAGS_random_model_context);
  if (random_context > 0) {
    dir = (std::filesystem::temp_directory_path() /
           ("dcformer-bench-model-" + std::to_string(random_context)))
              .string();
    const absl::Status st = WriteRandomModel(
        dir, SmallDcFormerConfig(128, 4, 8, 512, 300, random_context, 16), DType::kF32, 7);
    if (!st.ok()) {
      std::fprintf(stderr, "random model: %s\n", std::string(st.message()).c_str());
      return 1;
    }
  }
  auto backend_options = BackendOptionsFromFlags();
  if (!backend_options.ok()) {
    std::fprintf(stderr, "%s\n", std::string(backend_options.status().message()).c_str());
    return 2;
  }
  auto probe = LoadModel(dir, *backend_options);
  if (!probe.ok()) {
    std::fprintf(stderr, "%s\n", std::string(probe.status().message()).c_str());
    return 1;
  }
  auto workload = MakeWorkload(probe->config, dir);
  if (!workload.ok()) {
    std::fprintf(stderr, "%s\n", std::string(workload.status().message()).c_str());
    return 2;
  }
  const Workload w = *std::move(workload);
  int64_t prompt_tokens = 0;
  for (const auto& p : w.prompts) prompt_tokens += p.size();
  std::printf("model %s (context %d), %zu requests, %lld prompt tokens, %lld new tokens\n",
              dir.c_str(), probe->config.max_positions, w.prompts.size(),
              static_cast<long long>(prompt_tokens), static_cast<long long>(w.total_new));
  probe->backend.reset();
  if (absl::GetFlag(FLAGS_fma_peak)) PrintFmaPeak("before");

  Recorder batched_rec;
  int64_t batched_tokens = 0;
  auto batched = RunOnce(dir, w, true, &batched_rec, &batched_tokens);
  if (!batched.ok()) {
    std::fprintf(stderr, "%s\n", std::string(batched.status().message()).c_str());
    return 1;
  }
  batched_rec.Report("(a) continuous", *batched, batched_tokens);
  if (absl::GetFlag(FLAGS_fma_peak)) PrintFmaPeak("after (a)");
  if (absl::GetFlag(FLAGS_skip_sequential)) return 0;
  Recorder seq_rec;
  int64_t seq_tokens = 0;
  auto sequential = RunOnce(dir, w, false, &seq_rec, &seq_tokens);
  if (!sequential.ok()) {
    std::fprintf(stderr, "%s\n", std::string(sequential.status().message()).c_str());
    return 1;
  }
  seq_rec.Report("(b) one at a time", *sequential, seq_tokens);
  std::printf("throughput ratio (a)/(b): %.2fx\n",
              (batched_tokens / *batched) / (seq_tokens / *sequential));
  return 0;
}

}  // namespace
}  // namespace dcf

int main(int argc, char** argv) {
  std::vector<std::string> arg_storage;
  const std::vector<char*> rest = dcf::ParseToolCommandLine(
      argc, argv, "in-process benchmark of the DCFormer serving engine\n  dcformer-bench [--model-dir DIR] [--backend cpu] [--num-requests N] ...", arg_storage);
  if (rest.size() > 1) {
    std::fprintf(stderr, "dcformer-bench: unexpected argument '%s' (--help lists the flags)\n",
                 rest[1]);
    return 2;
  }
  return dcf::Main();
}
