// The weights of a DCFormer / DCPythia model as host tensors, loaded from a checkpoint and
// validated against the ModelConfig before anything runs. Tensors keep the checkpoint's
// dtype, or are converted while reading (WeightLoadOptions::dtype); backends convert or
// upload them as they need.
//
// Loading reads one tensor at a time straight into its final buffer, so peak memory is the
// loaded weights plus at most one tensor of file pages.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "engine/weights/checkpoint.h"
#include "engine/weights/tensor.h"

namespace dcf {

// Empty tensors mean "absent" (biases of dcformer, qk-norm scales when use_qk_norm is off).
// Shapes are the file's (e.g. dw1 is [E, 1, C, K]); the comments give the row-major view the
// backends use.
struct LayerWeights {
  Tensor attention_norm_w, attention_norm_b;  // [E]
  Tensor wqkv_w;                              // [3E, E] rows: Q | K | V, head-major
  Tensor wqkv_b;                              // [3E]
  Tensor wo_w;                                // [E, E]
  Tensor wo_b;                                // [E]
  Tensor q_norm, k_norm;                      // [hd]
  Tensor dw1;                                 // [E, C*K]  (file: [E,1,C,K])
  Tensor qkw;                                 // [C, K, 2I, N] (file: [1,C,K,2I,N])
  Tensor dd;                                  // [E, C*N]  (file: [E,1,C*N])
  Tensor ffn_norm_w, ffn_norm_b;              // [E]
  Tensor w1_w, w1_b;                          // [F, E], [F]
  Tensor w3_w;                                // [F, E] (dcformer only)
  Tensor w2_w, w2_b;                          // [E, F], [E]
  // int8 checkpoints (ModelConfig::int8_group_size G > 0) only: wqkv_w, wo_w, w1_w, w3_w
  // and w2_w are then I8 and these their scales [out, ceil(in / G)] BF16 (file name: the
  // matrix's name + "_scale"); empty otherwise.
  Tensor wqkv_s, wo_s, w1_s, w3_s, w2_s;

  // Every tensor of the layer (absent ones included, as empty tensors).
  std::vector<Tensor*> All();
};

struct ModelWeights {
  Tensor tok_embeddings;  // [V, E]
  std::vector<LayerWeights> layers;
  Tensor norm_w, norm_b;  // [E]
  Tensor output;          // [V, E] (I8 in an int8 checkpoint)
  Tensor output_s;        // [V, ceil(E / G)] BF16: its scales in an int8 checkpoint

  // Every tensor of the model (absent ones included, as empty tensors).
  std::vector<Tensor*> All();
  int64_t NumParameters();
  size_t NumBytes();
  // Converts every float tensor to `dtype` in place, one at a time (int8 matrices and their
  // scales are left as they are).
  void ConvertTo(DType dtype);
};

struct WeightLoadOptions {
  // Convert every tensor to this dtype while reading; nullopt keeps the checkpoint's dtype.
  // The int8 matrices of an int8 checkpoint and their BF16 scales are always read as stored.
  std::optional<DType> dtype = DType::kF32;
  // Scan every tensor for NaN and infinity after reading it (one pass over the weights):
  // InvalidArgument naming the first tensor that holds any, as corrupt when the stored values
  // do, else as out of `dtype`'s range (CheckFiniteConversion). Off by default; a model with
  // such weights otherwise loads, and the engine ends each request whose logits come out
  // non-finite.
  bool check_finite = false;
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// Every tensor a checkpoint for `config` must hold (fused wqkv form), with its file shape.
std::vector<TensorSpec> ExpectedTensors(const ModelConfig& config);

// The tensors of `w` (as LoadModelWeights returned it for `config`) with their checkpoint
// names, in ExpectedTensors order (fused wqkv form; int8 scales after their matrices).
std::vector<std::pair<std::string, Tensor*>> NamedTensors(const ModelConfig& config,
                                                         ModelWeights& w);

// Validates the checkpoint's names, shapes and dtypes against `config` (derived/dead keys
// listed in DCFORMER.md are ignored; any other missing, extra or misshapen tensor is an
// InvalidArgument naming it), then reads everything (see WeightLoadOptions). The layer count
// is checked against the layers the checkpoint holds (0, 1, 2, ... up to the first index
// with no tensor) before anything is built per layer, so a config that names more layers
// than the files hold fails at once (InvalidArgument naming n_layer), whatever it claims and
// whatever far layer index a stray tensor names. ResourceExhausted when host memory runs out.
absl::StatusOr<ModelWeights> LoadModelWeights(const ModelConfig& config, CheckpointReader& reader,
                                              const WeightLoadOptions& options = {});

}  // namespace dcf
