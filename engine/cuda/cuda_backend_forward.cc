// CudaBackend (cuda_backend.h), part 2 of 2: the forward pass of one step as IssueStep runs it
// (cuda_backend.cc holds the lifecycle and the step machinery): the embedding, each layer's
// attention (AttentionLayer) and MLP (FeedForward), the final norm and output projection of
// the logits rows (Logits), and the arguments of their products (Linear and the GEMV
// prologues/epilogues; LibraryProducts, which Prepare plans).
#include "engine/cuda/cuda_backend.h"

#include <cstdint>
#include <vector>

#include "engine/common/status_macros.h"
#include "engine/cuda/activation.h"
#include "engine/cuda/attention_input.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/embedding.h"
#include "engine/cuda/gemv.h"
#include "engine/cuda/norm.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace {

constexpr int C = ModelConfig::kComposeBranches;
constexpr int kI = ModelConfig::kRank;

}  // namespace

CacheView CudaBackend::CacheFor(LayerGroup g, const int32_t* table) const {
  const int gi = static_cast<int>(g);
  CacheView v;
  v.base = cache_[gi].get();
  v.dtype = dtype_;
  v.num_blocks = cache_shape_.num_blocks[gi];
  v.layers_in_group = layers_in_group_[gi];
  v.block_size = cache_shape_.block_size;
  v.row_elems = layout_.row_floats();
  v.block_table = table;
  return v;
}

absl::Status CudaBackend::Linear(int rows, const void* in, int64_t k, const DeviceMatrix& w,
                                 const DeviceBuffer& bias, float* y, int64_t n, bool accumulate) {
  const GemmArgs g = LinearArgs(rows, in, k, w, bias, y, n, accumulate);
  // Decode-sized batches stream each weight row once (gemv.h); larger ones go to the library.
  if (use_gemv_ && GemvHandles(g)) return CudaStatus(LaunchGemv(g, stream_), "GEMV");
  return gemm_->Linear(g, stream_);
}

GemmArgs CudaBackend::LinearArgs(int rows, const void* in, int64_t k, const DeviceMatrix& w,
                                 const DeviceBuffer& bias, float* y, int64_t n,
                                 bool accumulate) const {
  GemmArgs g;
  g.m = rows;
  g.n = static_cast<int>(n);
  g.k = static_cast<int>(k);
  g.x = in;
  g.ldx = k;
  g.w = w.w.get();
  g.dtype = dtype_;
  g.wtype = w.type;
  g.w_scale = w.scale.empty() ? nullptr : w.scale.as<float>();
  g.fp8_activations = fp8_activations_ && w.type == WeightType::kFp8;
  g.bias = bias.empty() ? nullptr : bias.as<float>();
  g.y = y;
  g.ldy = n;
  g.accumulate = accumulate;
  return g;
}

GemmArgs CudaBackend::NormedLinearArgs(int rows, const DeviceMatrix& w, const DeviceBuffer& bias,
                                       float* y, int64_t n) const {
  return LinearArgs(rows, x_.get(), config_.dim, w, bias, y, n, false);
}

GemmArgs CudaBackend::PythiaUpArgs(int rows, const DeviceLayerWeights& L) const {
  // y (up_) is named but not written: the kGelu epilogue writes act_ instead.
  return NormedLinearArgs(rows, L.w_up, L.b_up, up_.as<float>(), config_.intermediate_size);
}

GemvOut CudaBackend::PythiaUpOut() const {
  GemvOut out;
  out.epilogue = GemvEpilogue::kGelu;
  out.act = act_.get();
  out.act_type = dtype_;
  out.act_ld = config_.intermediate_size;
  return out;
}

std::vector<GemmArgs> CudaBackend::LibraryProducts() const {
  // The products of AttentionLayer, FeedForward and Logits (the library path), in that order.
  const int T = limits_.max_tokens;
  const int64_t E = config_.dim, F = config_.intermediate_size;
  const bool pythia = config_.architecture == Architecture::kDcPythia;
  std::vector<GemmArgs> products;
  for (const DeviceLayerWeights& L : weights_.layers) {
    products.push_back(LinearArgs(T, a_.get(), E, L.w_in, L.b_in, proj_.as<float>(),
                                  FusedInputWidth(config_), false));
    products.push_back(LinearArgs(T, attn_out_.get(), E, L.wo, L.wo_b, x_.as<float>(), E, true));
    products.push_back(LinearArgs(T, pythia ? a2_.get() : a_.get(), E, L.w_up, L.b_up,
                                  up_.as<float>(), pythia ? F : 2 * F, false));
    products.push_back(LinearArgs(T, act_.get(), F, L.w_down, L.b_down, x_.as<float>(), E, true));
  }
  products.push_back(LinearArgs(rows_cap_, final_in_.get(), config_.dim, weights_.output,
                                DeviceBuffer(), logits_.as<float>(), config_.vocab_size, false));
  return products;
}

GemvIn CudaBackend::NormPrologue(const DeviceBuffer& norm_w, const DeviceBuffer& norm_b) const {
  GemvIn in;
  in.norm_weight = norm_w.as<float>();
  in.layer_norm = config_.architecture == Architecture::kDcPythia;
  in.norm_bias = in.layer_norm && !norm_b.empty() ? norm_b.as<float>() : nullptr;
  in.eps = config_.norm_eps;
  return in;
}

NormParams CudaBackend::Norm(int rows, const DeviceBuffer& w, const DeviceBuffer& b,
                             void* out) const {
  NormParams np;
  np.rows = rows;
  np.dim = config_.dim;
  np.x = x_.as<float>();
  np.layer_norm = config_.architecture == Architecture::kDcPythia;
  np.eps = config_.norm_eps;
  np.weight = w.as<float>();
  np.bias = b.empty() ? nullptr : b.as<float>();
  np.out = out;
  np.out_type = dtype_;
  return np;
}

absl::Status CudaBackend::Forward(const StepArrays& d, const DevicePlan& plan) {
  EmbeddingParams ep;
  ep.num_tokens = plan.num_tokens;
  ep.dim = config_.dim;
  ep.tokens = d.tokens;
  ep.chained = sampled_.as<int32_t>();
  ep.vocab = config_.vocab_size;
  ep.table = weights_.embed.get();
  ep.table_type = dtype_;
  ep.out = x_.as<float>();
  RETURN_IF_ERROR(CudaStatus(LaunchEmbedding(ep, stream_), "embedding"));

  StepView sv;
  sv.num_tokens = plan.num_tokens;
  sv.num_seqs = plan.num_seqs;
  sv.positions = d.positions;
  sv.seq_offsets = d.seq_offsets;
  sv.token_seq = d.token_seq;
  sv.blocks_per_seq = limits_.blocks_per_seq;
  sv.max_seq_tokens = plan.max_seq_tokens;
  sv.max_position = plan.max_position;
  for (int l = 0; l < config_.n_layer; ++l) {
    RETURN_IF_ERROR(AttentionLayer(l, d, sv));
    RETURN_IF_ERROR(FeedForward(l, plan.num_tokens));
  }
  return Logits(d, plan);
}

absl::Status CudaBackend::AttentionLayer(int layer, const StepArrays& d, const StepView& sv) {
  const DeviceLayerWeights& L = weights_.layers[layer];
  const int T = sv.num_tokens;
  const int64_t E = config_.dim, N = config_.n_head, K = config_.dynamic_hidden();
  const int64_t P = FusedInputWidth(config_);  // per token: q | k | v | a.dw1 [C, K] | a.dd [C, N]
  const int64_t dyn_stride = C * 2 * kI * N;
  const bool pythia = config_.architecture == Architecture::kDcPythia;

  if (const GemmArgs in = NormedLinearArgs(T, L.w_in, L.b_in, proj_.as<float>(), P);
      use_gemv_ && GemvHandles(in)) {
    // The norm in the GEMV's prologue (gemv.h): no kernel of its own.
    RETURN_IF_ERROR(CudaStatus(
        LaunchGemv(in, GemvOut{}, NormPrologue(L.attn_norm_w, L.attn_norm_b), stream_),
        "attention norm + GEMV"));
    if (pythia) {
      // Parallel residual: the MLP's input is the LayerNorm of this same x, so its GEMV
      // (LayerNorm prologue, GELU epilogue into act_) runs now, before the attention's
      // residual add changes x; FeedForward then has only the down projection left.
      RETURN_IF_ERROR(CudaStatus(LaunchGemv(PythiaUpArgs(T, L), PythiaUpOut(),
                                            NormPrologue(L.ffn_norm_w, L.ffn_norm_b), stream_),
                                 "MLP norm + GEMV + GELU"));
    }
  } else {
    NormParams np = Norm(T, L.attn_norm_w, L.attn_norm_b, a_.get());
    if (pythia) {  // parallel residual: both branches normalise the same x
      np.weight2 = L.ffn_norm_w.as<float>();
      np.bias2 = L.ffn_norm_b.empty() ? nullptr : L.ffn_norm_b.as<float>();
      np.out2 = a2_.get();
    }
    RETURN_IF_ERROR(CudaStatus(LaunchNorm(np, stream_), "attention norm"));
    RETURN_IF_ERROR(Linear(T, a_.get(), E, L.w_in, L.b_in, proj_.as<float>(), P, false));
  }

  const LayerGroup group = config_.GroupOf(layer);
  // qk-norm + RoPE, the dynamic-weight tail and the KV-cache row write: one kernel.
  AttentionInputParams ip;
  QkRopeParams& qp = ip.rope;
  qp.num_tokens = T;
  qp.n_head = static_cast<int>(N);
  qp.head_dim = config_.head_dim;
  qp.rotary_dim = config_.rotary_dim;
  qp.qkv = proj_.as<float>();
  qp.stride = P;
  if (config_.use_qk_norm) {
    qp.q_norm = L.q_norm.as<float>();
    qp.k_norm = L.k_norm.as<float>();
  }
  qp.positions = d.positions;
  qp.cos_table = rope_cos_.as<float>();
  qp.sin_table = rope_sin_.as<float>();
  DynWeightsParams& dp = ip.dyn;
  dp.num_tokens = T;
  dp.n_head = static_cast<int>(N);
  dp.proj = proj_.as<float>();
  dp.stride = P;
  dp.u_offset = 3 * E;
  dp.g_offset = 3 * E + C * K;
  dp.qkw = L.qkw.get();
  dp.qkw_type = dtype_;
  dp.dyn = dyn_.as<float>();
  dp.dyn_stride = dyn_stride;
  ip.step = sv;
  ip.cache = CacheFor(group, d.tables[static_cast<int>(group)]);
  ip.window = group == LayerGroup::kWindow ? config_.window_size : 0;
  ip.layer_in_group = config_.IndexInGroup(layer);
  RETURN_IF_ERROR(CudaStatus(LaunchAttentionInput(ip, stream_), "attention input"));

  DcmhaLayerArgs args;
  args.n_head = static_cast<int>(N);
  args.head_dim = config_.head_dim;
  args.window = group == LayerGroup::kWindow ? config_.window_size : 0;
  args.layer_in_group = config_.IndexInGroup(layer);
  args.compose = options_.compose;
  args.qkv = proj_.as<float>();
  args.qkv_stride = P;
  args.dyn = dyn_.as<float>();
  args.dyn_stride = dyn_stride;
  args.gates = proj_.as<float>() + 3 * E + C * K;
  args.gates_stride = P;
  args.cache = CacheFor(group, d.tables[static_cast<int>(group)]);
  args.out = attn_out_.get();
  args.out_dtype = dtype_;
  args.workspace = attn_workspace_.get();
  args.workspace_bytes = attn_workspace_.bytes();
  RETURN_IF_ERROR(CudaStatus(LaunchDcmha(sv, args, stream_), "DCMHA attention"));
  // x += attention . Wo^T (+ b)
  return Linear(T, attn_out_.get(), E, L.wo, L.wo_b, x_.as<float>(), E, true);
}

absl::Status CudaBackend::FeedForward(int layer, int num_tokens) {
  const DeviceLayerWeights& L = weights_.layers[layer];
  const int T = num_tokens;
  const int64_t E = config_.dim, F = config_.intermediate_size;
  const bool pythia = config_.architecture == Architecture::kDcPythia;
  // dcpythia normalised its MLP input with the attention input (parallel residual).
  const void* mlp_in = a2_.get();
  if (pythia && use_gemv_ && GemvHandles(PythiaUpArgs(T, L))) {
    // AttentionLayer's GEMV wrote the activation (LayerNorm prologue, GELU epilogue).
    return Linear(T, act_.get(), F, L.w_down, L.b_down, x_.as<float>(), E, true);
  }
  if (!pythia) {
    const GemmArgs fused = NormedLinearArgs(T, L.w_up, L.b_up, up_.as<float>(), 2 * F);
    if (use_gemv_ && GemvHandles(fused)) {
      // The RMSNorm in the prologue and SwiGLU in the epilogue of one GEMV (gemv.h).
      GemvOut out;
      out.epilogue = GemvEpilogue::kSwiGlu;
      out.act = act_.get();
      out.act_type = dtype_;
      out.act_ld = F;
      const GemvIn in = NormPrologue(L.ffn_norm_w, DeviceBuffer());
      RETURN_IF_ERROR(
          CudaStatus(LaunchGemv(fused, out, in, stream_), "MLP norm + GEMV + SwiGLU"));
      return Linear(T, act_.get(), F, L.w_down, L.b_down, x_.as<float>(), E, true);
    }
    NormParams np = Norm(T, L.ffn_norm_w, DeviceBuffer(), a_.get());
    RETURN_IF_ERROR(CudaStatus(LaunchNorm(np, stream_), "MLP norm"));
    mlp_in = a_.get();
  }
  ActivationParams ap;
  ap.rows = T;
  ap.width = static_cast<int>(F);
  ap.in = up_.as<float>();
  ap.out = act_.get();
  ap.out_type = dtype_;
  ap.kind = pythia ? Activation::kGelu : Activation::kSwiGlu;
  // dcpythia: up = w1 h; dcformer: up = [w1 h | w3 h].
  RETURN_IF_ERROR(
      Linear(T, mlp_in, E, L.w_up, L.b_up, up_.as<float>(), pythia ? F : 2 * F, false));
  RETURN_IF_ERROR(CudaStatus(LaunchActivation(ap, stream_), "MLP activation"));
  // x += act . W2^T (+ b)
  return Linear(T, act_.get(), F, L.w_down, L.b_down, x_.as<float>(), E, true);
}

absl::Status CudaBackend::Logits(const StepArrays& d, const DevicePlan& plan) {
  const int rows = static_cast<int>(plan.logits.rows.size());
  if (rows == 0) return absl::OkStatus();
  // Final norm and output projection, only for the rows that need logits.
  if (const GemmArgs out = NormedLinearArgs(rows, weights_.output, DeviceBuffer(),
                                            logits_.as<float>(), config_.vocab_size);
      use_gemv_ && GemvHandles(out)) {
    // The norm, gathering those rows of x, in the GEMV's prologue (gemv.h): no kernel of its own.
    GemvIn in = NormPrologue(weights_.norm_w, weights_.norm_b);
    in.row_index = d.logit_rows;
    return CudaStatus(LaunchGemv(out, GemvOut{}, in, stream_), "final norm + logits GEMV");
  }
  NormParams np = Norm(rows, weights_.norm_w, weights_.norm_b, final_in_.get());
  np.row_index = d.logit_rows;
  RETURN_IF_ERROR(CudaStatus(LaunchNorm(np, stream_), "final norm"));
  return Linear(rows, final_in_.get(), config_.dim, weights_.output, DeviceBuffer(),
                logits_.as<float>(), config_.vocab_size, false);
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
