// dcformer-model-bench: whole-model decode speed against the memory roofline, on any backend
// (issue 8 section 5; run on a GPU by scripts/gpu-check.sh, docs/GPU_CHECK.md).
//
//   dcformer-model-bench --model DIR [--backend cuda --dtype bfloat16] [--nocompose]
//       [--decode-batches 1,64 --context 2048 --decode-steps 32]
//       [--serve-requests 64 --serve-prompt 512 --serve-new 256] [--peak-gbps 4800]
//       [--json-out FILE]
//
// decode: for each batch B, B sequences are prefilled to --context tokens, then
//   --decode-steps greedy decode steps of all B at once are timed (after 2 untimed ones).
//   Bytes per step = weight bytes + the KV-cache rows every query reads (each layer's
//   visible keys, full rows with the compose terms); roofline tokens/s = B * peak bandwidth
//   / bytes per step.
// serve: --serve-requests greedy requests of --serve-prompt random tokens and
//   --serve-new new tokens each (EOS ignored), enqueued at once into the serving engine:
//   output tokens/s, steps, and the share of peak bandwidth that the weight reads of every
//   step plus the KV reads of every decoded token make up (an estimate: prefill attention
//   and activations are not counted).
// Weight bytes per step: every layer's matrices and the output head in the dtype the backend
// keeps them in (the embedding table is not read, one row per token aside); --weight-bytes
// overrides.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "engine/backends/backend_factory.h"
#include "engine/backends/backend_flags.h"
#include "engine/common/flag_names.h"
#include "engine/common/status_macros.h"
#include "engine/execution/step_batch.h"
#include "engine/serving/engine.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "", "model directory (config.json + weights)");
ABSL_FLAG(bool, compose, true, "DCMHA compose; --nocompose: plain multi-head attention");
ABSL_FLAG(std::string, decode_batches, "1,64", "decode batch sizes (empty: skip)");
ABSL_FLAG(int, context, 2048, "cached tokens per sequence before the timed decode steps");
ABSL_FLAG(int, decode_steps, 32, "timed decode steps per batch size");
ABSL_FLAG(int, prefill_chunk, 2048, "prefill chunk (tokens per step) while filling the cache");
ABSL_FLAG(int, block_size, 16, "KV cache block size");
ABSL_FLAG(int, serve_requests, 0, "requests of the serving run (0: skip)");
ABSL_FLAG(int, serve_prompt, 512, "prompt tokens per serving request");
ABSL_FLAG(int, serve_new, 256, "new tokens per serving request");
ABSL_FLAG(int, serve_batched_tokens, 2048, "EngineOptions::max_num_batched_tokens of the run");
ABSL_FLAG(double, peak_gbps, 4800, "peak memory bandwidth, GB/s (H200: 4800)");
ABSL_FLAG(int64_t, weight_bytes, 0, "bytes of weights read per step (0: from the config)");
ABSL_FLAG(std::string, json_out, "", "also write the results as JSON to this file");

namespace dcf {
namespace {

// Parameters a decode step reads: per layer wqkv and wo (4 E^2), the feed-forward (3 E F, or
// 2 E F for DCPythia), the dynamic-weight projections (E C K + C K 2I N + E C N); plus the
// output head (V E). Norms and biases are left out (under 0.1%).
int64_t StepParameters(const ModelConfig& c) {
  const int64_t E = c.dim, F = c.intermediate_size, N = c.n_head, V = c.vocab_size;
  const int64_t C = ModelConfig::kComposeBranches, K = c.dynamic_hidden(), I = ModelConfig::kRank;
  const int64_t ffn = (c.architecture == Architecture::kDcPythia ? 2 : 3) * E * F;
  const int64_t layer = 4 * E * E + ffn + E * C * K + C * K * 2 * I * N + E * C * N;
  return c.n_layer * layer + V * E;
}

// Bytes of KV-cache rows one query at position `pos` reads over all layers.
double KvBytesPerQuery(const Backend& b, int block_size, int pos) {
  const ModelConfig& c = b.config();
  double bytes = 0;
  for (LayerGroup g : {LayerGroup::kGlobal, LayerGroup::kWindow}) {
    if (c.NumLayersIn(g) == 0) continue;
    const int keys =
        g == LayerGroup::kWindow && c.window_size > 0 ? std::min(pos + 1, c.window_size) : pos + 1;
    bytes += static_cast<double>(b.BytesPerBlock(g, block_size)) / block_size * keys;
  }
  return bytes;
}

std::vector<int32_t> RandomTokens(std::mt19937& rng, int n, int vocab) {
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return t;
}

// Prefills `batch` sequences to `context` tokens, then times `steps` decode steps of all of
// them together.
absl::StatusOr<nlohmann::json> TimeDecode(Backend& backend, int batch, int context, int steps,
                                          double weight_bytes) {
  const ModelConfig& c = backend.config();
  const int B = absl::GetFlag(FLAGS_block_size);
  const int chunk = std::max(1, absl::GetFlag(FLAGS_prefill_chunk));
  constexpr int kWarmup = 2;
  if (context < 1 || context + kWarmup + steps + 1 > c.max_positions) {
    return absl::InvalidArgumentError(absl::StrCat("--context ", context, " + ", kWarmup + steps,
                                                   " decode steps exceeds the model context ",
                                                   c.max_positions));
  }
  const int blocks_per_seq = (c.max_positions + B - 1) / B;
  StepLimits limits;
  limits.max_tokens = std::max(batch, std::min(chunk, context));
  limits.max_seqs = batch;
  limits.max_logit_rows = batch;
  limits.blocks_per_seq = blocks_per_seq;
  RETURN_IF_ERROR(backend.Prepare(limits).status());
  KvCacheShape shape;
  shape.block_size = B;
  shape.window = c.window_size;
  const int end = context + kWarmup + steps + 1;
  shape.num_blocks[static_cast<int>(LayerGroup::kGlobal)] =
      c.NumLayersIn(LayerGroup::kGlobal) > 0 ? batch * ((end + B - 1) / B) : 0;
  shape.num_blocks[static_cast<int>(LayerGroup::kWindow)] =
      c.NumLayersIn(LayerGroup::kWindow) > 0
          ? batch * (std::min(c.window_size > 0 ? c.window_size : end, end) / B + 3)
          : 0;
  RETURN_IF_ERROR(backend.AllocateCache(shape));
  KvCacheManager manager(shape);
  std::vector<SequenceKv> seqs(batch);
  StepBatch step;
  StepOutput out;
  SamplingRow greedy;
  greedy.params.temperature = 0;
  std::mt19937 rng(7);
  const absl::Time fill0 = absl::Now();
  std::vector<int32_t> next(batch);
  for (int s = 0; s < batch; ++s) {
    const std::vector<int32_t> prompt = RandomTokens(rng, context, c.vocab_size);
    for (int i = 0; i < context; i += chunk) {
      const int n = std::min(chunk, context - i);
      RETURN_IF_ERROR(manager.Reserve(seqs[s], i + n));
      step.Reset(blocks_per_seq);
      const bool last = i + n == context;
      step.AddSequence({prompt.data() + i, static_cast<size_t>(n)}, seqs[s], last, greedy, false);
      RETURN_IF_ERROR(backend.Step(step, &out));
      manager.Commit(seqs[s], i + n);
      if (last) next[s] = out.tokens[0];
    }
  }
  const double fill_s = absl::ToDoubleSeconds(absl::Now() - fill0);
  double kv_bytes = 0;
  absl::Time t0;
  for (int k = 0; k < kWarmup + steps; ++k) {
    if (k == kWarmup) t0 = absl::Now();
    step.Reset(blocks_per_seq);
    for (int s = 0; s < batch; ++s) {
      const int len = seqs[s].num_tokens;
      RETURN_IF_ERROR(manager.Reserve(seqs[s], len + 1));
      step.AddSequence({&next[s], 1}, seqs[s], true, greedy, false);
      if (k >= kWarmup) kv_bytes += KvBytesPerQuery(backend, B, len);
    }
    RETURN_IF_ERROR(backend.Step(step, &out));
    for (int s = 0; s < batch; ++s) {
      manager.Commit(seqs[s], seqs[s].num_tokens + 1);
      next[s] = out.tokens[s];
    }
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  for (SequenceKv& s : seqs) manager.Free(s);
  const double ms_per_step = seconds * 1e3 / steps;
  const double bytes_per_step = weight_bytes + kv_bytes / steps;
  const double peak = absl::GetFlag(FLAGS_peak_gbps) * 1e9;
  const double tokens_per_s = batch * steps / seconds;
  const double roofline = batch * peak / bytes_per_step;
  return nlohmann::json{{"batch", batch},
                        {"context", context},
                        {"steps", steps},
                        {"prefill_s", fill_s},
                        {"ms_per_step", ms_per_step},
                        {"tokens_per_s", tokens_per_s},
                        {"bytes_per_step", bytes_per_step},
                        {"kv_bytes_per_step", kv_bytes / steps},
                        {"roofline_tokens_per_s", roofline},
                        {"share_of_roofline", tokens_per_s / roofline}};
}

class StepCounter : public EngineObserver {
 public:
  void OnStep(int, int, int, absl::Duration) override { steps_.fetch_add(1); }
  int64_t steps() const { return steps_.load(); }

 private:
  std::atomic<int64_t> steps_{0};
};

absl::StatusOr<nlohmann::json> TimeServe(std::unique_ptr<Backend> backend, double weight_bytes) {
  const ModelConfig c = backend->config();
  const int n = absl::GetFlag(FLAGS_serve_requests);
  const int prompt_len = absl::GetFlag(FLAGS_serve_prompt);
  const int new_tokens = absl::GetFlag(FLAGS_serve_new);
  const int B = absl::GetFlag(FLAGS_block_size);
  if (prompt_len < 1 || new_tokens < 1 || prompt_len + new_tokens > c.max_positions) {
    return absl::InvalidArgumentError("--serve-prompt + --serve-new must fit the model context");
  }
  // The KV bytes every decoded token reads (computed before the engine owns the backend).
  double kv_bytes = 0;
  for (int p = prompt_len; p < prompt_len + new_tokens - 1; ++p) {
    kv_bytes += KvBytesPerQuery(*backend, B, p);
  }
  kv_bytes *= n;
  EngineOptions o;
  o.block_size = B;
  o.max_num_seqs = n;
  o.max_num_batched_tokens = std::max(n, absl::GetFlag(FLAGS_serve_batched_tokens));
  o.max_queued_requests = std::max(o.max_queued_requests, n);
  o.kv_cache_fraction = 0.9;
  StepCounter counter;
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                   Engine::Create(std::move(backend), nullptr, o, &counter));
  std::mt19937 rng(11);
  std::vector<RequestHandle> handles;
  const absl::Time t0 = absl::Now();
  for (int i = 0; i < n; ++i) {
    GenerationRequest r;
    r.prompt_tokens = RandomTokens(rng, prompt_len, c.vocab_size);
    r.sampling.temperature = 0;
    r.stopping.max_new_tokens = new_tokens;
    r.stopping.ignore_eos = true;
    r.output.text = false;
    ASSIGN_OR_RETURN(RequestHandle h, engine->Enqueue(std::move(r)));
    handles.push_back(std::move(h));
  }
  int64_t tokens = 0;
  for (RequestHandle& h : handles) {
    GenerationChunk chunk;
    while (!h.stream().done()) {
      h.stream().WaitTake(&chunk);
      tokens += static_cast<int64_t>(chunk.tokens.size());
    }
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);
  const EngineStats stats = engine->Stats();
  engine->Shutdown();
  if (!stats.healthy) return absl::InternalError(stats.failure);
  const double bytes = counter.steps() * weight_bytes + kv_bytes;
  return nlohmann::json{
      {"requests", n},
      {"prompt_tokens", prompt_len},
      {"new_tokens", new_tokens},
      {"seconds", seconds},
      {"output_tokens", tokens},
      {"tokens_per_s", tokens / seconds},
      {"steps", counter.steps()},
      {"preemptions", stats.num_preemptions},
      {"estimated_bytes", bytes},
      {"share_of_peak_bandwidth", bytes / seconds / (absl::GetFlag(FLAGS_peak_gbps) * 1e9)}};
}

int Main() {
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "dcformer-model-bench: %s\n", s.ToString().c_str());
    return 1;
  };
  const std::string dir = absl::GetFlag(FLAGS_model);
  if (dir.empty()) {
    std::fprintf(stderr, "dcformer-model-bench: --model is required\n");
    return 2;
  }
  std::vector<int> batches;
  for (absl::string_view p :
       absl::StrSplit(absl::GetFlag(FLAGS_decode_batches), ',', absl::SkipWhitespace())) {
    int b = 0;
    if (!absl::SimpleAtoi(p, &b) || b < 1) {
      std::fprintf(stderr, "dcformer-model-bench: --decode-batches: '%s' is not a batch size\n",
                   std::string(p).c_str());
      return 2;
    }
    batches.push_back(b);
  }
  absl::StatusOr<BackendOptions> options = BackendOptionsFromFlags();
  if (!options.ok()) {
    std::fprintf(stderr, "dcformer-model-bench: %s\n",
                 std::string(options.status().message()).c_str());
    return 2;
  }
  options->compose = absl::GetFlag(FLAGS_compose);
  const absl::Time load0 = absl::Now();
  absl::StatusOr<LoadedModel> model = LoadModel(dir, *options);
  if (!model.ok()) return fail(model.status());
  const double load_s = absl::ToDoubleSeconds(absl::Now() - load0);
  const BackendInfo info = model->backend->info();
  const double weight_bytes =
      absl::GetFlag(FLAGS_weight_bytes) > 0
          ? static_cast<double>(absl::GetFlag(FLAGS_weight_bytes))
          : static_cast<double>(StepParameters(model->config)) *
                (info.channel_quant != WeightQuant::kNone
                     ? 1.0  // int8 / fp8 per output channel (the scales are 4 / K bytes)
                 : info.int8_weight_group > 0
                     // + scales (int8 x int8: and the sums of q)
                     ? 1.0 + (info.int8_activations ? 4.0 : 2.0) / info.int8_weight_group
                     : DTypeSize(info.dtype));
  nlohmann::json report = {{"benchmark", "model"},
                           {"model", dir},
                           {"backend", info.name},
                           {"device", info.device},
                           {"dtype", ComputeDTypeName(info.dtype)},
                           {"weights", WeightsName(info)},
                           {"compose", absl::GetFlag(FLAGS_compose)},
                           {"load_s", load_s},
                           {"weight_bytes", weight_bytes},
                           {"peak_gbps", absl::GetFlag(FLAGS_peak_gbps)},
                           {"decode", nlohmann::json::array()}};
  std::printf("model %s on %s (%s, %s), compose %s, weights %.3f GB, loaded in %.1f s\n",
              dir.c_str(), info.name.c_str(), info.device.c_str(), ComputeDTypeName(info.dtype),
              absl::GetFlag(FLAGS_compose) ? "on" : "off", weight_bytes / 1e9, load_s);
  for (int b : batches) {
    absl::StatusOr<nlohmann::json> r = TimeDecode(*model->backend, b, absl::GetFlag(FLAGS_context),
                                                  absl::GetFlag(FLAGS_decode_steps), weight_bytes);
    if (!r.ok()) return fail(r.status());
    std::printf(
        "decode batch %3d at context %d: %9.3f ms/step %10.1f tokens/s  "
        "(roofline %.1f tokens/s: %.1f%%)\n",
        b, absl::GetFlag(FLAGS_context), (*r)["ms_per_step"].get<double>(),
        (*r)["tokens_per_s"].get<double>(), (*r)["roofline_tokens_per_s"].get<double>(),
        100 * (*r)["share_of_roofline"].get<double>());
    std::fflush(stdout);
    report["decode"].push_back(*r);
  }
  if (absl::GetFlag(FLAGS_serve_requests) > 0) {
    absl::StatusOr<nlohmann::json> r = TimeServe(std::move(model->backend), weight_bytes);
    if (!r.ok()) return fail(r.status());
    std::printf(
        "serve %d requests x (%d + %d): %.1f tokens/s, %lld steps, %.1f%% of peak "
        "bandwidth (estimate)\n",
        absl::GetFlag(FLAGS_serve_requests), absl::GetFlag(FLAGS_serve_prompt),
        absl::GetFlag(FLAGS_serve_new), (*r)["tokens_per_s"].get<double>(),
        static_cast<long long>((*r)["steps"].get<int64_t>()),
        100 * (*r)["share_of_peak_bandwidth"].get<double>());
    report["serve"] = *r;
  }
  const std::string json_out = absl::GetFlag(FLAGS_json_out);
  if (!json_out.empty()) {
    std::ofstream f(json_out);
    f << report.dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "dcformer-model-bench: cannot write --json-out %s\n", json_out.c_str());
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace dcf

int main(int argc, char** argv) {
  std::vector<std::string> storage;
  dcf::ParseToolCommandLine(
      argc, argv,
      "whole-model decode speed against the memory roofline (bench/README.md)\n"
      "  dcformer-model-bench --model DIR [--backend cuda] [--decode-batches 1,64] ...",
      storage);
  return dcf::Main();
}
