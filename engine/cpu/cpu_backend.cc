#include "engine/cpu/cpu_backend.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/cpu/cpu_ops.h"
#include "engine/cpu/dcmha.h"

namespace dcf {
namespace {

constexpr int C = ModelConfig::kComposeBranches;
constexpr int kI = ModelConfig::kRank;
constexpr float kQkNormEps = 1e-6f;  // fixed by the reference, independent of norm_eps
constexpr float kDynNormEps = 1e-6f;
// Below these sizes an OpenMP fork/join costs more than the work it splits.
constexpr int64_t kMinParallelTokens = 4;

// x[hd] <- x / sqrt(mean(x^2) + eps) * scale
void HeadRmsNorm(float* x, const float* scale, int hd) {
  float ss = 0;
  for (int d = 0; d < hd; ++d) ss += x[d] * x[d];
  const float inv = 1.0f / std::sqrt(ss / hd + kQkNormEps);
  for (int d = 0; d < hd; ++d) x[d] = x[d] * inv * scale[d];
}

}  // namespace

int NumLogitRows(absl::Span<const ForwardSpan> spans) {
  int rows = 0;
  for (const ForwardSpan& s : spans) rows += s.all_logits ? static_cast<int>(s.tokens.size()) : 1;
  return rows;
}

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(const ModelConfig& config,
                                                               ModelWeights weights) {
  if (config.n_head > 256) {
    return absl::InvalidArgumentError("n_head > 256 is not supported by the CPU backend");
  }
  return std::unique_ptr<CpuBackend>(new CpuBackend(config, std::move(weights)));
}

CpuBackend::CpuBackend(const ModelConfig& config, ModelWeights weights)
    : config_(config), weights_(std::move(weights)), layout_(config) {
  for (int g = 0; g < kNumLayerGroups; ++g) {
    layers_in_group_[g] = config_.NumLayersIn(static_cast<LayerGroup>(g));
  }
}

size_t CpuBackend::BytesPerBlock(LayerGroup g, int block_size) const {
  return sizeof(float) * static_cast<size_t>(layers_in_group_[static_cast<int>(g)]) *
         block_size * layout_.row_floats();
}

absl::Status CpuBackend::AllocateCache(const KvCacheShape& shape) {
  if (shape.block_size <= 0 || shape.num_blocks[0] < 0 || shape.num_blocks[1] < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache shape: block size ", shape.block_size, " and block counts ",
        shape.num_blocks[0], ", ", shape.num_blocks[1], " must be positive"));
  }
  const bool has_window_layers = layers_in_group_[static_cast<int>(LayerGroup::kWindow)] > 0;
  if (has_window_layers && shape.window != config_.window_size) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache shape: window ", shape.window,
                                                   " differs from the model's window_size ",
                                                   config_.window_size));
  }
  cache_shape_ = KvCacheShape();  // unusable until the allocation succeeded
  for (int g = 0; g < kNumLayerGroups; ++g) {
    const size_t floats = BytesPerBlock(static_cast<LayerGroup>(g), shape.block_size) /
                          sizeof(float) * static_cast<size_t>(shape.num_blocks[g]);
    cache_[g].clear();
    cache_[g].shrink_to_fit();
    try {  // std::vector reports allocation failure by exception; turn it into a Status
      cache_[g].resize(floats);
    } catch (const std::bad_alloc&) {
      cache_[0].clear();
      cache_[1].clear();
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", floats * sizeof(float), " bytes of KV cache"));
    }
  }
  cache_shape_ = shape;
  return absl::OkStatus();
}

float* CpuBackend::CacheRows(LayerGroup g, int32_t block, int layer_in_group) {
  const int gi = static_cast<int>(g);
  const size_t B = cache_shape_.block_size;
  return cache_[gi].data() +
         ((static_cast<size_t>(block) * layers_in_group_[gi] + layer_in_group) * B) *
             layout_.row_floats();
}

absl::Status CpuBackend::Validate(absl::Span<const ForwardSpan> spans,
                                  absl::Span<float> logits) const {
  const int B = cache_shape_.block_size;
  if (B <= 0) return absl::FailedPreconditionError("AllocateCache was not called");
  for (size_t i = 0; i < spans.size(); ++i) {
    const ForwardSpan& s = spans[i];
    if (s.kv == nullptr || s.tokens.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("span ", i, " is empty"));
    }
    if (s.start_pos != s.kv->num_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("span ", i, " starts at position ", s.start_pos, " but its sequence holds ",
                       s.kv->num_tokens, " tokens"));
    }
    const int end = s.start_pos + static_cast<int>(s.tokens.size());
    if (s.start_pos < 0 || end > config_.max_positions) {
      return absl::OutOfRangeError(absl::StrCat("positions [", s.start_pos, ", ", end,
                                                ") exceed the model context of ",
                                                config_.max_positions));
    }
    for (int32_t t : s.tokens) {
      if (t < 0 || t >= config_.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", t, " is outside the vocabulary [0, ", config_.vocab_size,
                         ")"));
      }
    }
    // Every block read (past keys) or written (new rows) must be present.
    for (int g = 0; g < kNumLayerGroups; ++g) {
      if (layers_in_group_[g] == 0) continue;
      const int window = g == static_cast<int>(LayerGroup::kWindow) ? config_.window_size : 0;
      const int read_from = FirstKeptPosition(window, s.start_pos);
      const int write_from = std::max(s.start_pos, FirstKeptPosition(window, end));
      const auto& table = s.kv->blocks[g];
      for (int p = std::min(read_from, write_from); p < end; ++p) {
        if (p >= s.start_pos && p < write_from) continue;  // new rows that are not kept
        const int blk = p / B;
        if (blk >= static_cast<int>(table.size()) || table[blk] < 0 ||
            table[blk] >= cache_shape_.num_blocks[g]) {
          return absl::FailedPreconditionError(
              absl::StrCat("span ", i, ": no KV block for position ", p, " in the ",
                           g == 0 ? "global" : "window", " group"));
        }
      }
    }
  }
  const size_t rows = NumLogitRows(spans);
  if (logits.size() != rows * config_.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat("logits buffer holds ", logits.size(),
                                                   " floats, expected ", rows, " rows"));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Forward(absl::Span<const ForwardSpan> spans, absl::Span<float> logits) {
  RETURN_IF_ERROR(Validate(spans, logits));
  const int64_t E = config_.dim, F = config_.intermediate_size, V = config_.vocab_size;
  const int64_t N = config_.n_head, K = config_.dynamic_hidden();
  const int half = config_.rotary_dim / 2;
  int64_t T = 0;
  for (const ForwardSpan& s : spans) T += static_cast<int64_t>(s.tokens.size());

  Scratch& s = s_;
  s.span_of.resize(T);
  s.pos.resize(T);
  s.x.resize(T * E);
  s.a.resize(T * E);
  s.y.resize(T * E);
  s.o.resize(T * E);
  s.qkv.resize(T * 3 * E);
  s.u.resize(T * C * K);
  s.dw.resize(T * C * 2 * kI * N);
  s.g.resize(T * C * N);
  s.rows.resize(T * layout_.row_floats());
  s.ff1.resize(T * F);
  s.ff3.resize(T * F);
  s.rope_cos.resize(T * half);
  s.rope_sin.resize(T * half);

  {
    int64_t t = 0;
    for (size_t i = 0; i < spans.size(); ++i) {
      for (size_t j = 0; j < spans[i].tokens.size(); ++j, ++t) {
        s.span_of[t] = static_cast<int32_t>(i);
        s.pos[t] = spans[i].start_pos + static_cast<int64_t>(j);
        std::memcpy(&s.x[t * E], &weights_.tok_embeddings[spans[i].tokens[j] * E],
                    sizeof(float) * E);
      }
    }
  }
#pragma omp parallel for schedule(static) if (T >= kMinParallelTokens)
  for (int64_t t = 0; t < T; ++t) {
    cpu::RopeAngles(s.pos[t], config_.rotary_dim, config_.rope_base, &s.rope_cos[t * half],
                    &s.rope_sin[t * half]);
  }

  const bool pythia = config_.architecture == Architecture::kDcPythia;
  auto norm = [&](const std::vector<float>& w, const std::vector<float>& b, const float* in,
                  int64_t rows, float* out) {
    if (pythia) {
      cpu::LayerNorm(in, w.data(), b.empty() ? nullptr : b.data(), rows, E, config_.norm_eps,
                     out);
    } else {
      cpu::RmsNorm(in, w.data(), rows, E, config_.norm_eps, out);
    }
  };

  for (int l = 0; l < config_.n_layer; ++l) {
    const LayerWeights& L = weights_.layers[l];
    norm(L.attention_norm_w, L.attention_norm_b, s.x.data(), T, s.a.data());
    AttentionLayer(l, spans);  // reads s.a, writes s.y = attention output (with bias)
    if (pythia) {
      // Parallel residual: both branches read the same x.
      norm(L.ffn_norm_w, L.ffn_norm_b, s.x.data(), T, s.a.data());
      FeedForward(l, s.a.data(), s.o.data());
      for (int64_t i = 0; i < T * E; ++i) s.x[i] += s.y[i] + s.o[i];
    } else {
      for (int64_t i = 0; i < T * E; ++i) s.x[i] += s.y[i];
      norm(L.ffn_norm_w, L.ffn_norm_b, s.x.data(), T, s.a.data());
      FeedForward(l, s.a.data(), s.o.data());
      for (int64_t i = 0; i < T * E; ++i) s.x[i] += s.o[i];
    }
  }

  // Final norm and output projection, only for the rows that want logits.
  std::vector<int64_t> want;
  {
    int64_t t = 0;
    for (const ForwardSpan& sp : spans) {
      const int64_t n = static_cast<int64_t>(sp.tokens.size());
      for (int64_t j = sp.all_logits ? 0 : n - 1; j < n; ++j) want.push_back(t + j);
      t += n;
    }
  }
  const int64_t R = static_cast<int64_t>(want.size());
  for (int64_t r = 0; r < R; ++r) {
    std::memcpy(&s.y[r * E], &s.x[want[r] * E], sizeof(float) * E);
  }
  norm(weights_.norm_w, weights_.norm_b, s.y.data(), R, s.a.data());
  cpu::Linear(s.a.data(), weights_.output.data(), nullptr, R, E, V, logits.data());
  return absl::OkStatus();
}

void CpuBackend::AttentionLayer(int layer, absl::Span<const ForwardSpan> spans) {
  const LayerWeights& L = weights_.layers[layer];
  Scratch& s = s_;
  const int64_t T = static_cast<int64_t>(s.pos.size());
  const int64_t E = config_.dim, N = config_.n_head, hd = config_.head_dim,
                K = config_.dynamic_hidden();
  const int half = config_.rotary_dim / 2;
  const int64_t W2I = 2 * kI * N;  // floats of W1|W2 for one branch
  const int row = layout_.row_floats();

  // Projections for all tokens of the step at once.
  cpu::Linear(s.a.data(), L.wqkv_w.data(), L.wqkv_b.empty() ? nullptr : L.wqkv_b.data(), T, E,
              3 * E, s.qkv.data());
  cpu::MatMul(s.a.data(), E, L.dw1.data(), C * K, T, E, C * K, s.u.data(), C * K);
  cpu::MatMul(s.a.data(), E, L.dd.data(), C * N, T, E, C * N, s.g.data(), C * N);
  for (int64_t i = 0; i < T * C * K; ++i) s.u[i] = cpu::GeluErf(s.u[i]);
  for (int c = 0; c < C; ++c) {
    // w[t, c, :, :] = u[t, c, :] @ qkw[c]   ([K] x [K, 2I*N])
    cpu::MatMul(s.u.data() + c * K, C * K, L.qkw.data() + c * K * W2I, W2I, T, K, W2I,
                s.dw.data() + c * W2I, C * W2I);
  }

#pragma omp parallel for schedule(static) if (T >= kMinParallelTokens)
  for (int64_t t = 0; t < T; ++t) {
    float* gt = &s.g[t * C * N];
    for (int64_t i = 0; i < C * N; ++i) gt[i] = std::tanh(gt[i]);
    for (int c = 0; c < C; ++c) {
      for (int i = 0; i < kI; ++i) {  // normalise W1 over heads (no scale)
        float* w1 = &s.dw[((t * C + c) * 2 * kI + i) * N];
        float ss = 0;
        for (int64_t n = 0; n < N; ++n) ss += w1[n] * w1[n];
        const float inv = 1.0f / std::sqrt(ss / N + kDynNormEps);
        for (int64_t n = 0; n < N; ++n) w1[n] *= inv;
      }
    }
    float* q = &s.qkv[t * 3 * E];
    float* k = q + E;
    const float* v = q + 2 * E;
    for (int64_t n = 0; n < N; ++n) {
      if (config_.use_qk_norm) {
        HeadRmsNorm(q + n * hd, L.q_norm.data(), hd);
        HeadRmsNorm(k + n * hd, L.k_norm.data(), hd);
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
      std::memcpy(dst, &s.dw[(t * C + c) * W2I], sizeof(float) * W2I);
      std::memcpy(dst + W2I, &gt[c * N], sizeof(float) * N);
    }
  }

  // Keep the new rows future queries need, and describe every span's keys as segments.
  const LayerGroup group = config_.GroupOf(layer);
  const int gi = static_cast<int>(group);
  const int lig = config_.IndexInGroup(layer);
  const int window = group == LayerGroup::kWindow ? config_.window_size : 0;
  const int B = cache_shape_.block_size;
  std::vector<std::vector<cpu::KeySegment>> segments(spans.size());
  std::vector<int64_t> first_token(spans.size());
  {
    int64_t t0 = 0;
    for (size_t i = 0; i < spans.size(); ++i) {
      const ForwardSpan& sp = spans[i];
      const int n = static_cast<int>(sp.tokens.size());
      const int end = sp.start_pos + n;
      first_token[i] = t0;
      const auto& table = sp.kv->blocks[gi];
      for (int p = std::max(sp.start_pos, FirstKeptPosition(window, end)); p < end; ++p) {
        std::memcpy(CacheRows(group, table[p / B], lig) + static_cast<int64_t>(p % B) * row,
                    &s.rows[(t0 + p - sp.start_pos) * row], sizeof(float) * row);
      }
      for (int p0 = FirstKeptPosition(window, sp.start_pos) / B * B; p0 < sp.start_pos;
           p0 += B) {
        const int lo = std::max(p0, FirstKeptPosition(window, sp.start_pos));
        const int hi = std::min(p0 + B, sp.start_pos);
        segments[i].push_back({lo, hi - lo,
                               CacheRows(group, table[p0 / B], lig) +
                                   static_cast<int64_t>(lo - p0) * row,
                               row});
      }
      segments[i].push_back({sp.start_pos, n, &s.rows[t0 * row], row});
      t0 += n;
    }
  }

  int64_t max_keys = 0;
  for (int64_t t = 0; t < T; ++t) {
    max_keys = std::max<int64_t>(max_keys, s.pos[t] - FirstKeptPosition(window, s.pos[t]) + 1);
  }
#pragma omp parallel if (T > 1)  // one query (batch-1 decode) stays on one thread
  {
    std::vector<float> scratch(max_keys * N);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < T; ++t) {
      const float* q = &s.qkv[t * 3 * E];
      cpu::QueryInputs qi;
      qi.q = q;
      qi.pre_w = &s.dw[(t * C + 0) * W2I];
      qi.pre_g = &s.g[(t * C + 0) * N];
      qi.post_w = &s.dw[(t * C + 2) * W2I];
      qi.post_g = &s.g[(t * C + 2) * N];
      const int64_t pos = s.pos[t];
      cpu::AttendOne(layout_, qi, segments[s.span_of[t]], FirstKeptPosition(window, pos), pos,
                     scratch.data(), &s.o[t * E]);
    }
  }
  cpu::Linear(s.o.data(), L.wo_w.data(), L.wo_b.empty() ? nullptr : L.wo_b.data(), T, E, E,
              s.y.data());
}

void CpuBackend::FeedForward(int layer, const float* h, float* out) {
  const LayerWeights& L = weights_.layers[layer];
  Scratch& s = s_;
  const int64_t T = static_cast<int64_t>(s.pos.size());
  const int64_t E = config_.dim, F = config_.intermediate_size;
  if (config_.architecture == Architecture::kDcPythia) {
    cpu::Linear(h, L.w1_w.data(), L.w1_b.empty() ? nullptr : L.w1_b.data(), T, E, F,
                s.ff1.data());
#pragma omp parallel for schedule(static) if (T >= kMinParallelTokens)
    for (int64_t i = 0; i < T * F; ++i) s.ff1[i] = cpu::GeluErf(s.ff1[i]);
  } else {
    cpu::Linear(h, L.w1_w.data(), nullptr, T, E, F, s.ff1.data());
    cpu::Linear(h, L.w3_w.data(), nullptr, T, E, F, s.ff3.data());
#pragma omp parallel for schedule(static) if (T >= kMinParallelTokens)
    for (int64_t i = 0; i < T * F; ++i) s.ff1[i] = cpu::Silu(s.ff1[i]) * s.ff3[i];
  }
  cpu::Linear(s.ff1.data(), L.w2_w.data(), L.w2_b.empty() ? nullptr : L.w2_b.data(), T, F, E,
              out);
}

}  // namespace dcf
