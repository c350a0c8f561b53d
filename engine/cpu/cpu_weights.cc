#include "engine/cpu/cpu_weights.h"

#include <algorithm>

#include "engine/execution/step_plan.h"

namespace dcf::cpu {
namespace {

constexpr int C = ModelConfig::kComposeBranches;
constexpr int kI = ModelConfig::kRank;

// A row-major [out, in] source, with its scales when it is I8.
PackedMatrix::Source Matrix(const Tensor& t, const Tensor& scales, int64_t out, int64_t in) {
  PackedMatrix::Source s{t.data(), t.dtype(), out, false, in};
  if (t.dtype() == DType::kI8) s.scales = static_cast<const uint16_t*>(scales.data());
  return s;
}

// int8 matrices as `int8` says, else the sources' common dtype.
PackedMatrix Pack(const std::vector<PackedMatrix::Source>& sources, int64_t in,
                  Int8Matrices int8) {
  if (int8.enabled()) return PackedMatrix::QuantizeInt8(sources, in, int8);
  return PackedMatrix::Concat(sources, in, PackedMatrix::CommonDType(sources));
}

// Linear weight [out, in] (shape from the tensor), then the tensor is released.
// `scales`: those of an I8 tensor (an int8 checkpoint), else empty.
PackedMatrix Rows(Tensor& t, Tensor& scales, Int8Matrices int8) {
  if (t.empty()) return PackedMatrix();
  const int64_t out = t.shape()[0], in = t.numel() / out;
  PackedMatrix m = Pack({Matrix(t, scales, out, in)}, in, int8);
  t = Tensor();
  scales = Tensor();
  return m;
}

Tensor F32(Tensor& t) {
  t.ConvertTo(DType::kF32);
  return std::move(t);
}

size_t Bytes(const Tensor& t) { return t.nbytes(); }

}  // namespace

CpuWeights PackWeights(const ModelConfig& config, ModelWeights w, Int8Matrices int8) {
  if (!int8.enabled()) int8.activations = false;
  const int64_t E = config.dim, N = config.n_head, K = config.dynamic_hidden();
  const int64_t F = config.intermediate_size;
  const int64_t W2I = 2 * kI * N;
  CpuWeights out;
  out.tok_embeddings = std::move(w.tok_embeddings);
  out.norm_w = F32(w.norm_w);
  out.norm_b = F32(w.norm_b);
  out.int8 = int8;
  out.matrix_dtype = int8.enabled() ? out.tok_embeddings.dtype() : w.output.dtype();
  out.output = Rows(w.output, w.output_s, int8);
  out.layers.resize(w.layers.size());
  for (size_t l = 0; l < w.layers.size(); ++l) {
    LayerWeights& s = w.layers[l];
    CpuLayerWeights& d = out.layers[l];
    using Source = PackedMatrix::Source;
    const std::vector<Source> in_proj = {Matrix(s.wqkv_w, s.wqkv_s, 3 * E, E),
                                         {s.dw1.data(), s.dw1.dtype(), C * K, true, C * K},
                                         {s.dd.data(), s.dd.dtype(), C * N, true, C * N}};
    d.in_proj = Pack(in_proj, E, int8);
    if (!s.wqkv_b.empty()) {
      d.in_proj_b = Tensor(DType::kF32, {FusedInputWidth(config)});
      float* b = d.in_proj_b.f32();
      ConvertToF32(s.wqkv_b.dtype(), s.wqkv_b.data(), 3 * E, b);
      std::fill(b + 3 * E, b + d.in_proj_b.numel(), 0.0f);
    }
    s.wqkv_w = Tensor();
    s.wqkv_s = Tensor();
    s.dw1 = Tensor();
    s.dd = Tensor();
    d.wo = Rows(s.wo_w, s.wo_s, int8);
    const size_t branch_bytes = static_cast<size_t>(K * W2I) * DTypeSize(s.qkw.dtype());
    for (int c = 0; c < C; ++c) {
      d.qkw[c] = PackedMatrix::FromColumns(static_cast<const uint8_t*>(s.qkw.data()) +
                                               c * branch_bytes,
                                           s.qkw.dtype(), K, W2I, W2I, s.qkw.dtype());
    }
    s.qkw = Tensor();
    if (s.w3_w.empty()) {
      d.up = Rows(s.w1_w, s.w1_s, int8);
    } else {
      const std::vector<Source> up = {Matrix(s.w1_w, s.w1_s, F, E), Matrix(s.w3_w, s.w3_s, F, E)};
      d.up = Pack(up, E, int8);
      s.w1_w = Tensor();
      s.w3_w = Tensor();
      s.w1_s = Tensor();
      s.w3_s = Tensor();
    }
    d.w2 = Rows(s.w2_w, s.w2_s, int8);
    if (l == 0 && !int8.enabled()) out.matrix_dtype = d.in_proj.dtype();
    d.attention_norm_w = F32(s.attention_norm_w);
    d.attention_norm_b = F32(s.attention_norm_b);
    d.ffn_norm_w = F32(s.ffn_norm_w);
    d.ffn_norm_b = F32(s.ffn_norm_b);
    d.wo_b = F32(s.wo_b);
    d.q_norm = F32(s.q_norm);
    d.k_norm = F32(s.k_norm);
    d.up_b = F32(s.w1_b);
    d.w2_b = F32(s.w2_b);
  }
  return out;
}

size_t CpuWeights::BytesReadPerToken() const {
  size_t n = output.nbytes() + Bytes(norm_w) + Bytes(norm_b);
  if (!tok_embeddings.empty()) {
    n += tok_embeddings.nbytes() / static_cast<size_t>(tok_embeddings.shape()[0]);
  }
  for (const CpuLayerWeights& l : layers) {
    for (const PackedMatrix* m : {&l.in_proj, &l.wo, &l.up, &l.w2}) {
      n += m->nbytes();
    }
    for (const PackedMatrix& m : l.qkw) n += m.nbytes();
    for (const Tensor* t : {&l.attention_norm_w, &l.attention_norm_b, &l.ffn_norm_w,
                            &l.ffn_norm_b, &l.in_proj_b, &l.wo_b, &l.q_norm, &l.k_norm,
                            &l.up_b, &l.w2_b}) {
      n += Bytes(*t);
    }
  }
  return n;
}

void EmbeddingRow(const Tensor& table, int64_t token, float* out) {
  const int64_t E = table.shape()[1];
  ConvertToF32(table.dtype(),
               static_cast<const uint8_t*>(table.data()) + token * E * DTypeSize(table.dtype()),
               E, out);
}

}  // namespace dcf::cpu
