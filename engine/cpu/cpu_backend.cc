#include "engine/cpu/cpu_backend.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <new>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "engine/common/logging.h"
#include "engine/common/memory_info.h"
#include "engine/common/status_macros.h"
#include "engine/cpu/cpu_isa.h"
#include "engine/cpu/cpu_ops.h"
#include "engine/cpu/packed_matrix.h"
#include "engine/cpu/paged_attention.h"
#include "engine/cpu/dcmha.h"
#include "engine/execution/memory_bound.h"
#include "engine/execution/step_plan.h"

namespace dcf {
namespace {

constexpr int C = ModelConfig::kComposeBranches;
constexpr int kI = ModelConfig::kRank;
constexpr float kQkNormEps = 1e-6f;  // fixed by the reference, independent of norm_eps
constexpr float kDynNormEps = 1e-6f;

// x[hd] <- x / sqrt(mean(x^2) + eps) * scale
void HeadRmsNorm(float* x, const float* scale, int hd) {
  float ss = 0;
  for (int d = 0; d < hd; ++d) ss += x[d] * x[d];
  const float inv = 1.0f / std::sqrt(ss / hd + kQkNormEps);
  for (int d = 0; d < hd; ++d) x[d] = x[d] * inv * scale[d];
}

}  // namespace

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(
    const ModelConfig& config, ModelWeights weights, const CpuBackendOptions& options) {
  if (config.n_head > 256) {
    return absl::InvalidArgumentError("n_head > 256 is not supported by the CPU backend");
  }
  CpuBackendOptions o = options;
  const int asked = o.int8.group;
  if (asked != 0 && !cpu::PackedMatrix::ValidInt8GroupSize(asked)) {
    return absl::InvalidArgumentError(
        absl::StrCat("int8 weight group size ", asked, " (choose 32, 64 or 128)"));
  }
  if (config.int8_group_size > 0) {  // an int8 checkpoint: its group size, whatever asked
    if (asked != 0 && asked != config.int8_group_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "int8 weight group size ", asked, " asked, but the checkpoint is quantized in "
          "groups of ", config.int8_group_size, " (config.json quantization_config)"));
    }
    o.int8.group = config.int8_group_size;
  }
  if (o.int8.activations && !o.int8.enabled()) {
    return absl::InvalidArgumentError(
        "int8 activations need int8 matrices (an int8 weight group size or an int8 checkpoint)");
  }
  if (o.int8.activations && !cpu::HasAvx512Vnni()) {
    DCF_LOG(Warning) << "int8 x int8 products: this CPU has no AVX-512 VNNI, so they run the "
                        "portable code (built for AVX2 where the CPU has it), one output at a "
                        "time: likely slower than int8 weight-only (--activation-dtype float32)";
  }
  return std::unique_ptr<CpuBackend>(new CpuBackend(config, std::move(weights), o));
}

CpuBackend::CpuBackend(const ModelConfig& config, ModelWeights weights,
                       const CpuBackendOptions& options)
    : config_(config),
      weights_(cpu::PackWeights(config, std::move(weights), options.int8)),
      layout_(config),
      compose_(options.compose),
      kv_dtype_(options.kv_cache_dtype) {
  for (int g = 0; g < kNumLayerGroups; ++g) {
    layers_in_group_[g] = config_.NumLayersIn(static_cast<LayerGroup>(g));
  }
}

void CpuBackend::Product(const float* x, int64_t ldx, int64_t rows, const cpu::PackedMatrix& w,
                         const float* bias, float* y, int64_t ldy) {
  cpu::MatMul(x, ldx, rows, w, bias, y, ldy, cpu::ActiveIsa(), &s_.quant);
}

void CpuBackend::Product(cpu::Team& team, const float* x, int64_t ldx, int64_t rows,
                         const cpu::PackedMatrix& w, const float* bias, float* y, int64_t ldy) {
  cpu::MatMul(team, x, ldx, rows, w, bias, y, ldy, cpu::ActiveIsa(), &s_.quant);
}

BackendInfo CpuBackend::info() const {
  BackendInfo info;
  info.name = "cpu";
  info.dtype = weights_.matrix_dtype;
  info.int8_weight_group = weights_.int8.group;
  info.int8_activations = weights_.int8.activations;
  info.kv_cache_dtype = kv_dtype_;
  // The CPU model, as /proc/cpuinfo names it, and the threads OpenMP will use.
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "model name")) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        info.device = std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
      }
      break;
    }
  }
  if (info.device.empty()) info.device = "CPU";
  absl::StrAppend(&info.device, ", ", omp_get_max_threads(), " threads, ",
                  cpu::IsaName(cpu::ActiveIsa()));
  return info;
}

absl::StatusOr<size_t> CpuBackend::Prepare(const StepLimits& limits) {
  RETURN_IF_ERROR(ValidateStepLimits(limits));
  limits_ = limits;
  in_flight_ = 0;  // results of steps not waited for are dropped, and nothing chains them
  last_tokens_.clear();
  last_chainable_.clear();
  try {  // std::vector reports allocation failure by exception; turn it into a Status
    penalty_slots_.assign(limits.num_penalty_slots, PenaltyState(config_.vocab_size));
    // A step's team: the threads OpenMP gives now (a later omp_set_num_threads does not
    // change it, so the samplers' scratch always has one per thread).
    team_threads_ = std::max(1, omp_get_max_threads());
    sampler_scratch_.resize(team_threads_);
    // The largest step's activations, so no step allocates (and the report below counts them).
    const int64_t T = limits.max_tokens, E = config_.dim, F = config_.intermediate_size;
    const int64_t N = config_.n_head;
    const int64_t rows = MaxLogitRows(limits);
    for (std::vector<float>* v : {&s_.x, &s_.a, &s_.y, &s_.o}) v->reserve(T * E);
    s_.tokens.reserve(T);
    s_.qkv.reserve(T * FusedInputWidth(config_));
    s_.dw.reserve(T * C * 2 * kI * N);
    s_.rows.reserve(T * layout_.row_floats());
    if (kv_dtype_ != DType::kF32) s_.rows16.reserve(T * layout_.row_floats());
    s_.up.reserve(T * 2 * F);
    s_.act.reserve(T * F);
    s_.logits.reserve(rows * config_.vocab_size);
    // Every product's quantized (int8 x int8) or packed x: the widest input is E or F
    // columns.
    s_.quant.Reserve(std::max<int64_t>(T, rows), std::max(E, F), weights_.int8.group,
                     weights_.int8.activations);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("cannot allocate the CPU backend's step workspace");
  }
  return AvailableHostMemoryBytes();
}

absl::Status CpuBackend::SetPenaltyState(int slot, absl::Span<const int32_t> prompt,
                                         absl::Span<const int32_t> generated) {
  if (slot < 0 || slot >= static_cast<int>(penalty_slots_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("penalty slot ", slot, " is not one of the ",
                                                   penalty_slots_.size(), " prepared"));
  }
  penalty_slots_[slot].Reset(prompt, generated);
  return absl::OkStatus();
}

double CpuBackend::MatMulFlopsPerToken() const {
  double elements = 0;
  for (const cpu::CpuLayerWeights& l : weights_.layers) {
    for (const cpu::PackedMatrix* m : {&l.in_proj, &l.wo, &l.up, &l.w2}) {
      elements += static_cast<double>(m->in()) * static_cast<double>(m->out());
    }
    for (const cpu::PackedMatrix& m : l.qkw) {
      elements += static_cast<double>(m.in()) * static_cast<double>(m.out());
    }
  }
  return 2 * elements;
}

size_t CpuBackend::BytesPerBlock(LayerGroup g, int block_size) const {
  return KvBytesPerBlock(config_, g, block_size, DTypeSize(kv_dtype_));
}

absl::Status CpuBackend::AllocateCache(const KvCacheShape& shape) {
  RETURN_IF_ERROR(ValidateCacheShape(shape, config_));
  cache_shape_ = KvCacheShape();  // unusable until the allocation succeeded
  for (int g = 0; g < kNumLayerGroups; ++g) {
    const size_t bytes = BytesPerBlock(static_cast<LayerGroup>(g), shape.block_size) *
                         static_cast<size_t>(shape.num_blocks[g]);
    cache_[g] = cpu::LargeBuffer();
    try {  // allocation failure is reported by exception; turn it into a Status
      cache_[g] = cpu::LargeBuffer(bytes);
    } catch (const std::bad_alloc&) {
      cache_[0] = cpu::LargeBuffer();
      cache_[1] = cpu::LargeBuffer();
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " bytes of KV cache"));
    }
    // Touch it now, so the memory is the process's from the start (as Prepare counted it).
    // (A group without layers or blocks has no buffer: memset of a null pointer is UB.)
    if (cache_[g].size() > 0) std::memset(cache_[g].data(), 0, cache_[g].size());
  }
  cache_shape_ = shape;
  return absl::OkStatus();
}

int CpuBackend::MeasureMemoryBoundTokens(int max_tokens) {
  const int64_t E = config_.dim;
  int64_t widest_in = E, widest_out = weights_.output.out();
  for (const cpu::CpuLayerWeights& L : weights_.layers) {
    for (const cpu::PackedMatrix* m : {&L.in_proj, &L.wo, &L.up, &L.w2}) {
      widest_in = std::max(widest_in, m->in());
      widest_out = std::max(widest_out, m->out());
    }
  }
  // Bounded like a step: at most kMaxTried rows are ever timed (the rule stops earlier on
  // any machine where the arithmetic shows).
  constexpr int kMaxTried = 64;
  const int most = std::min(max_tokens, kMaxTried);
  std::vector<float> x(static_cast<size_t>(most * widest_in), 0.01f);
  std::vector<float> y(static_cast<size_t>(most * widest_out));
  const auto products = [&](int rows) {
    for (const cpu::CpuLayerWeights& L : weights_.layers) {
      for (const cpu::PackedMatrix* m : {&L.in_proj, &L.wo, &L.up, &L.w2}) {
        if (!m->empty()) {
          Product(x.data(), m->in(), rows, *m, nullptr, y.data(), m->out());
        }
      }
    }
    Product(x.data(), E, rows, weights_.output, nullptr, y.data(), weights_.output.out());
  };
  products(1);  // warm-up: pages, thread pool
  return MemoryBoundTokens(
      [&](int rows) {
        double best = std::numeric_limits<double>::infinity();
        for (int i = 0; i < 3; ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          products(rows);
          best = std::min(
              best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        return best;
      },
      most);
}

absl::Status CpuBackend::Launch(const StepBatch& batch) {
  if (in_flight_ == 2) {
    return absl::FailedPreconditionError("Launch while 2 steps are in flight");
  }
  RETURN_IF_ERROR(ValidateStepBatch(batch, config_, cache_shape_, limits_));
  RETURN_IF_ERROR(CheckChainedTokens(batch, last_chainable_));
  // Chained tokens are the previous step's samples, which this backend already holds (it
  // computed that step in its Launch); a slot that drew nothing reads as token 0.
  s_.tokens.assign(batch.tokens.begin(), batch.tokens.end());
  for (int32_t& t : s_.tokens) {
    if (const int slot = ChainedSlot(t); slot >= 0) t = std::max(last_tokens_[slot], 0);
  }
  const int V = config_.vocab_size;
  const LogitRows plan = PlanLogitRows(batch);
  // Into the result buffer that no step in flight holds (sized here, outside the step's
  // team); the returned rows come first: one block.
  StepOutput& result = results_[(oldest_ + in_flight_) % 2];
  const std::vector<int32_t> slots = batch.slot_offsets();
  result.Resize(slots.back(), plan.num_returned, V);
  Forward(batch, plan.rows, [&](cpu::Team& team) {
    cpu::PhaseTimer timer(LeaderProfile(team));
    if (team.leader() && plan.num_returned > 0) {
      std::memcpy(result.logits.data(), s_.logits.data(),
                  sizeof(float) * static_cast<size_t>(plan.num_returned) * V);
    }
    Sample(team, batch, plan, slots, &result);
    timer.Next(cpu::CpuStepProfile::kSample);
  });
  ++profile_.steps;
  profile_.tokens += batch.num_tokens();
  last_tokens_ = result.tokens;
  last_chainable_ = ChainableSlots(batch);
  ++in_flight_;
  return absl::OkStatus();
}

absl::Status CpuBackend::Wait(StepOutput* out) {
  if (in_flight_ == 0) return absl::FailedPreconditionError("Wait without a successful Launch");
  std::swap(*out, results_[oldest_]);
  oldest_ = (oldest_ + 1) % 2;
  --in_flight_;
  return absl::OkStatus();
}

void CpuBackend::Sample(cpu::Team& team, const StepBatch& batch, const LogitRows& plan,
                        const std::vector<int32_t>& slots, StepOutput* result) {
  const int V = config_.vocab_size;
  const int64_t num_samples = static_cast<int64_t>(plan.sampled_seqs.size());
  // Sequences sample independently (own draw counter, own penalty slot: ValidateStepBatch
  // checks that no two share one): in parallel. A verifying sequence's rows go in order,
  // each recorded in its penalty slot before the next is sampled, so row j counts the j
  // drafted tokens before it (they equal the tokens sampled so far); sampling stops after
  // the first row that differs from its draft (step_batch.h).
  team.ForEach(num_samples, [&](int64_t i) {
    const int s = plan.sampled_seqs[i];
    const SamplingRow& r = batch.sampling[s];
    const int n = batch.sample_rows[s];
    const int32_t* draft = batch.tokens.data() + batch.seq_offsets[s + 1] - (n - 1);  // [n - 1]
    PenaltyState* penalties = r.penalty_slot >= 0 ? &penalty_slots_[r.penalty_slot] : nullptr;
    for (int j = 0; j < n; ++j) {
      const absl::Span<const float> logits = absl::MakeConstSpan(s_.logits).subspan(
          static_cast<size_t>(plan.sample_row[s] + j) * V, V);
      const int32_t token = SampleToken(logits, r.params, r.seed, r.step + j, penalties,
                                        &sampler_scratch_[team.rank()]);
      float logprob = 0.0f;
      std::vector<TopLogprob> top;
      if (token >= 0 && (r.logprob || r.top_logprobs > 0)) {  // token < 0: logits not finite
        logprob = ComputeLogprobs(logits, token, r.top_logprobs, &top);
      }
      int32_t top_tokens[kMaxTopLogprobs];
      float top_logprobs[kMaxTopLogprobs];
      for (size_t k = 0; k < top.size(); ++k) {
        top_tokens[k] = top[k].token;
        top_logprobs[k] = top[k].logprob;
      }
      StoreSample(r, slots[s] + j, token, logprob, top_tokens, top_logprobs,
                  static_cast<int>(top.size()), result);
      if (token < 0) break;
      if (penalties != nullptr) penalties->Record(token);
      if (j + 1 < n && token != draft[j]) break;  // the rule of AcceptedDrafts
    }
  });
}

void CpuBackend::Forward(const StepBatch& batch, const std::vector<int32_t>& want,
                         absl::FunctionRef<void(cpu::Team&)> then) {
  using P = cpu::CpuStepProfile;
  const auto start = std::chrono::steady_clock::now();
  const int64_t E = config_.dim, F = config_.intermediate_size, V = config_.vocab_size;
  const int64_t N = config_.n_head;
  const int half = config_.rotary_dim / 2;
  const int64_t T = batch.num_tokens();
  const int S = batch.num_seqs();

  Scratch& s = s_;
  s.seqs.resize(S);
  for (int i = 0; i < S; ++i) {
    SeqView& v = s.seqs[i];
    v.start_pos = batch.start_pos(i);
    v.num_tokens = batch.seq_len(i);
    v.first_token = batch.seq_offsets[i];
    for (int g = 0; g < kNumLayerGroups; ++g) {
      v.table[g] = &batch.block_tables[g][static_cast<size_t>(i) * batch.blocks_per_seq];
    }
  }
  s.seq_of.resize(T);
  s.pos.resize(T);
  s.x.resize(T * E);
  s.a.resize(T * E);
  s.y.resize(T * E);
  s.o.resize(T * E);
  s.qkv.resize(T * FusedInputWidth(config_));
  s.dw.resize(T * C * 2 * kI * N);
  s.rows.resize(T * layout_.row_floats());
  if (kv_dtype_ != DType::kF32) s.rows16.resize(T * layout_.row_floats());
  s.up.resize(T * 2 * F);
  s.act.resize(T * F);
  s.rope_cos.resize(T * half);
  s.rope_sin.resize(T * half);

  for (int i = 0; i < S; ++i) {
    for (int64_t t = batch.seq_offsets[i]; t < batch.seq_offsets[i + 1]; ++t) {
      s.seq_of[t] = i;
      s.pos[t] = batch.positions[t];
      cpu::EmbeddingRow(weights_.tok_embeddings, s.tokens[t], &s.x[t * E]);
    }
  }
  // Sized here, outside the team (a std::bad_alloc inside its OpenMP region would end the
  // process); inside it only the attention plan and scratch grow, when a step needs more than
  // every one before it, and the samplers' top-logprob lists.
  s.paged.resize(S);
  const int64_t R = static_cast<int64_t>(want.size());
  s.logits.resize(R * V);

  const bool pythia = config_.architecture == Architecture::kDcPythia;
  auto norm = [&](const Tensor& w, const Tensor& b, const float* in, int64_t rows, float* out) {
    if (pythia) {
      cpu::LayerNorm(in, w.f32(), b.f32_or_null(), rows, E, config_.norm_eps, out);
    } else {
      cpu::RmsNorm(in, w.f32(), rows, E, config_.norm_eps, out);
    }
  };

  // The leader times the phases (each ends at the barrier after it): the embedding rows and
  // the team's start count in the first one, its end in the last (sampling, in `then`).
  std::chrono::steady_clock::time_point leader_done;
  cpu::RunTeam(team_threads_, [&](cpu::Team& team) {
    cpu::CpuStepProfile* const profile = LeaderProfile(team);
    cpu::PhaseTimer timer(profile, start);
    team.ForEach(T, [&](int64_t t) {
      RopeAngles(s.pos[t], config_.rotary_dim, config_.rope_base, &s.rope_cos[t * half],
                 &s.rope_sin[t * half]);
    });
    timer.Next(P::kEmbed);

    for (int l = 0; l < config_.n_layer; ++l) {
      const cpu::CpuLayerWeights& L = weights_.layers[l];
      // The leader: the previous layer's last residual add (below), then this norm.
      if (team.leader()) norm(L.attention_norm_w, L.attention_norm_b, s.x.data(), T, s.a.data());
      team.Barrier();
      timer.Next(P::kNorm);
      AttentionLayer(team, l);  // reads s.a, writes s.y = attention output (with bias)
      timer = cpu::PhaseTimer(profile);
      if (pythia) {
        // Parallel residual: both branches read the same x.
        if (team.leader()) norm(L.ffn_norm_w, L.ffn_norm_b, s.x.data(), T, s.a.data());
        team.Barrier();
        timer.Next(P::kNorm);
        FeedForward(team, l, s.a.data(), s.o.data());
        timer = cpu::PhaseTimer(profile);
        if (team.leader()) {
          for (int64_t i = 0; i < T * E; ++i) s.x[i] += s.y[i] + s.o[i];
        }
        timer.Next(P::kResidual);
      } else {
        if (team.leader()) {
          for (int64_t i = 0; i < T * E; ++i) s.x[i] += s.y[i];
          timer.Next(P::kResidual);
          norm(L.ffn_norm_w, L.ffn_norm_b, s.x.data(), T, s.a.data());
        }
        team.Barrier();
        timer.Next(P::kNorm);
        FeedForward(team, l, s.a.data(), s.o.data());
        timer = cpu::PhaseTimer(profile);
        if (team.leader()) {
          for (int64_t i = 0; i < T * E; ++i) s.x[i] += s.o[i];
        }
        timer.Next(P::kResidual);
      }
    }

    // Final norm and output projection, only for the rows that want logits.
    if (team.leader()) {
      for (int64_t r = 0; r < R; ++r) {
        std::memcpy(&s.y[r * E], &s.x[want[r] * E], sizeof(float) * E);
      }
      norm(weights_.norm_w, weights_.norm_b, s.y.data(), R, s.a.data());
    }
    team.Barrier();
    Product(team, s.a.data(), E, R, weights_.output, nullptr, s.logits.data(), V);
    timer.Next(P::kLogits);
    then(team);
    if (team.leader()) leader_done = std::chrono::steady_clock::now();
  });
  profile_.seconds[P::kSample] +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - leader_done).count();
}

void CpuBackend::AttentionLayer(cpu::Team& team, int layer) {
  using P = cpu::CpuStepProfile;
  cpu::CpuStepProfile* const profile = LeaderProfile(team);
  cpu::PhaseTimer timer(profile);
  const cpu::CpuLayerWeights& L = weights_.layers[layer];
  Scratch& s = s_;
  const int64_t T = static_cast<int64_t>(s.pos.size());
  const int64_t E = config_.dim, N = config_.n_head, hd = config_.head_dim,
                K = config_.dynamic_hidden();
  const int half = config_.rotary_dim / 2;
  const int64_t W2I = 2 * kI * N;  // floats of W1|W2 for one branch
  const int64_t ld = FusedInputWidth(config_);  // per token: q | k | v | u [C, K] | G [C, N]
  const int64_t u_off = 3 * E, g_off = 3 * E + C * K;
  const int row = layout_.row_floats();

  // One product for q, k, v and the dynamic-weight projections of every token.
  Product(team, s.a.data(), E, T, L.in_proj, L.in_proj_b.f32_or_null(), s.qkv.data(), ld);
  timer.Next(P::kInProj);

  // Per token: the dynamic weights (gelu, the qkw products, tanh, W1 normalised over
  // heads), qk-norm and RoPE, and the fresh cache row.
  team.ForEach(T, [&](int64_t t) {
    float* tok = &s.qkv[t * ld];
    float* u = tok + u_off;
    for (int64_t i = 0; i < C * K; ++i) u[i] = cpu::GeluErf(u[i]);
    float* dw = &s.dw[t * C * W2I];
    for (int c = 0; c < C; ++c) {
      // w[c, :, :] = u[c, :] @ qkw[c]   ([K] x [K, 2I*N])
      cpu::MatMul(u + c * K, K, 1, L.qkw[c], nullptr, dw + c * W2I, W2I);
    }
    float* gt = tok + g_off;
    for (int64_t i = 0; i < C * N; ++i) gt[i] = std::tanh(gt[i]);
    for (int c = 0; c < C; ++c) {
      for (int i = 0; i < kI; ++i) {  // normalise W1 over heads (no scale)
        float* w1 = dw + (c * 2 * kI + i) * N;
        float ss = 0;
        for (int64_t n = 0; n < N; ++n) ss += w1[n] * w1[n];
        const float inv = 1.0f / std::sqrt(ss / N + kDynNormEps);
        for (int64_t n = 0; n < N; ++n) w1[n] *= inv;
      }
    }
    float* q = tok;
    float* k = tok + E;
    const float* v = tok + 2 * E;
    for (int64_t n = 0; n < N; ++n) {
      if (config_.use_qk_norm) {
        HeadRmsNorm(q + n * hd, L.q_norm.f32(), hd);
        HeadRmsNorm(k + n * hd, L.k_norm.f32(), hd);
      }
      cpu::ApplyRope(q + n * hd, config_.rotary_dim, &s.rope_cos[t * half], &s.rope_sin[t * half]);
      cpu::ApplyRope(k + n * hd, config_.rotary_dim, &s.rope_cos[t * half], &s.rope_sin[t * half]);
    }
    float* r = &s.rows[t * row];
    std::memcpy(r + layout_.k_offset(), k, sizeof(float) * E);
    std::memcpy(r + layout_.v_offset(), v, sizeof(float) * E);
    for (int b = 0; b < 2; ++b) {
      const int c = 2 * b + 1;  // key-side branches: 1 (pre), 3 (post)
      float* dst = r + layout_.branch_offset(b);
      std::memcpy(dst, dw + c * W2I, sizeof(float) * W2I);
      std::memcpy(dst + W2I, &gt[c * N], sizeof(float) * N);
    }
    // A 16-bit cache: the row is rounded here, once, and every query of the step reads this
    // rounded row, as it would read it back from the cache.
    if (kv_dtype_ == DType::kBF16) {
      uint16_t* r16 = &s.rows16[t * row];
      for (int i = 0; i < row; ++i) r16[i] = FloatToBF16(r[i]);
    } else if (kv_dtype_ == DType::kF16) {
      uint16_t* r16 = &s.rows16[t * row];
      for (int i = 0; i < row; ++i) r16[i] = FloatToHalf(r[i]);
    }
  });
  timer.Next(P::kPerToken);

  const LayerGroup group = config_.GroupOf(layer);
  const int gi = static_cast<int>(group);
  const int S = static_cast<int>(s.seqs.size());
  if (team.leader()) {  // read by the leader alone (PagedAttention's plan); sized by Forward
    for (int i = 0; i < S; ++i) {
      s.paged[i] = {s.seqs[i].start_pos, s.seqs[i].num_tokens, s.seqs[i].first_token,
                    s.seqs[i].table[gi]};
    }
  }
  cpu::PagedAttentionInputs in;
  in.layout = layout_;
  in.window = group == LayerGroup::kWindow ? config_.window_size : 0;
  in.compose = compose_;
  in.seqs = s.paged.data();
  in.num_seqs = S;
  in.positions = s.pos.data();
  in.seq_of = s.seq_of.data();
  in.num_tokens = T;
  in.rows = kv_dtype_ == DType::kF32 ? static_cast<const void*>(s.rows.data())
                                      : static_cast<const void*>(s.rows16.data());
  in.q = s.qkv.data();
  in.q_stride = ld;
  in.dw = s.dw.data();
  in.g = s.qkv.data() + g_off;
  in.g_stride = ld;
  in.cache = {cache_[gi].data(), layers_in_group_[gi], config_.IndexInGroup(layer),
              cache_shape_.block_size, kv_dtype_};
  cpu::PagedAttentionTimes times;
  cpu::PagedAttention(team, in, &s.attention, s.o.data(), &times);
  if (team.leader()) {
    profile_.seconds[P::kCacheWrite] += times.cache_write;
    profile_.seconds[P::kAttention] += times.attention;
  }
  timer = cpu::PhaseTimer(profile);
  Product(team, s.o.data(), E, T, L.wo, L.wo_b.f32_or_null(), s.y.data(), E);
  timer.Next(P::kOutProj);
}

void CpuBackend::FeedForward(cpu::Team& team, int layer, const float* h, float* out) {
  using P = cpu::CpuStepProfile;
  cpu::PhaseTimer timer(LeaderProfile(team));
  const cpu::CpuLayerWeights& L = weights_.layers[layer];
  Scratch& s = s_;
  const int64_t T = static_cast<int64_t>(s.pos.size());
  const int64_t E = config_.dim, F = config_.intermediate_size;
  const int64_t up = L.up.out();  // 2F: [w1 h | w3 h] per token (dcformer), or F
  Product(team, h, E, T, L.up, L.up_b.f32_or_null(), s.up.data(), up);
  timer.Next(P::kFfnMatMul);
  const bool pythia = config_.architecture == Architecture::kDcPythia;
  team.ForEach(T, [&](int64_t t) {
    const float* u = &s.up[t * up];
    float* a = &s.act[t * F];
    if (pythia) {
      for (int64_t f = 0; f < F; ++f) a[f] = cpu::GeluErf(u[f]);
    } else {
      cpu::SiluMul(u, u + F, a, F, cpu::ActiveIsa());
    }
  });
  timer.Next(P::kFfnAct);
  Product(team, s.act.data(), F, T, L.w2, L.w2_b.f32_or_null(), out, E);
  timer.Next(P::kFfnMatMul);
}

}  // namespace dcf
