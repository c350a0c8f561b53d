// The model weights as the CPU backend holds them: every matrix packed for cpu::MatMul in
// the dtype it was loaded in (F32, F16 or BF16: the 16-bit ones are widened inside the
// kernel, so a step reads half the bytes), vectors (norms, biases, qk-norm scales) in fp32,
// and the token embedding table in its loaded dtype (one row widened per token).
//
// Immutable after PackWeights; safe to read from several threads.
#pragma once

#include <array>
#include <vector>

#include "engine/cpu/packed_matrix.h"
#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"

namespace dcf::cpu {

// Matrices that read the same input are concatenated, so one product (one pass of the
// threads) computes them all: the attention input projection [wqkv; dw1; dd] and, for
// dcformer, the FFN's [w1; w3].
struct CpuLayerWeights {
  // a in_proj^T = [q | k | v | dw1 (u before gelu) | dd (G before tanh)] per token:
  // [3E + C*K + C*N, E] (dw1 and dd transposed from their file layouts [E, 1, C, K] and
  // [E, 1, C*N]).
  PackedMatrix in_proj;
  PackedMatrix wo;  // [E, E]
  std::array<PackedMatrix, ModelConfig::kComposeBranches> qkw;  // [2I*N, K] per branch c
  PackedMatrix up;  // dcformer: [w1; w3] [2F, E]; dcpythia: w1 [F, E]
  PackedMatrix w2;  // [E, F]
  // fp32 vectors; empty when the architecture has none.
  Tensor attention_norm_w, attention_norm_b, ffn_norm_w, ffn_norm_b;  // [E]
  Tensor in_proj_b;  // [3E + C*K + C*N]: the wqkv bias, zeros after it
  Tensor wo_b;       // [E]
  Tensor q_norm, k_norm;  // [hd]
  Tensor up_b;       // [F] (dcpythia's w1 bias)
  Tensor w2_b;       // [E]
};

struct CpuWeights {
  Tensor tok_embeddings;  // [V, E] in its loaded dtype
  std::vector<CpuLayerWeights> layers;
  Tensor norm_w, norm_b;  // [E] fp32
  PackedMatrix output;    // [V, E]
  // dtype of the layer matrices (layer 0's in_proj); with int8 matrices the checkpoint's.
  DType matrix_dtype = DType::kF32;
  // int8.group > 0: every matrix but qkw is int8 in groups of that many columns (and with
  // int8.activations their products are int8 x int8).
  Int8Matrices int8;

  // Bytes of the weights one decode step reads: every matrix and vector, one embedding row.
  size_t BytesReadPerToken() const;
};

// Packs `w` (consumed tensor by tensor, so peak memory stays near one copy) for `config`.
// Matrices keep their dtype, or with int8.group > 0 (32, 64 or 128) are quantized to int8
// in groups of that many columns (PackedMatrix::QuantizeInt8), except the small compose
// matrices qkw (under 1% of the bytes, and DCMHA's composition is the part of the model most
// sensitive to its weights); vectors are converted to fp32. The I8 matrices of an int8
// checkpoint (config.int8_group_size, which int8.group must then equal) are copied with their
// scales, the rest quantized as above: the same matrices as quantizing the float checkpoint
// it was made from. int8.activations lays the int8 matrices out for int8 x int8 products
// (their activations quantized too); ignored without a group.
CpuWeights PackWeights(const ModelConfig& config, ModelWeights w, Int8Matrices int8 = {});

// Writes row `token` of the embedding table as fp32 to out[E].
void EmbeddingRow(const Tensor& table, int64_t token, float* out);

}  // namespace dcf::cpu
