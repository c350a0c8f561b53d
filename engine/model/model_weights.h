// The weights of a DCFormer / DCPythia model as contiguous fp32 host arrays, loaded from a
// checkpoint and validated against the ModelConfig before anything runs.
//
// Loading reads one tensor at a time straight into its final fp32 buffer, so peak memory is
// the fp32 weights plus at most one tensor of file pages.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "engine/weights/checkpoint.h"

namespace dcf {

// Empty vectors mean "absent" (biases of dcformer, qk-norm scales when use_qk_norm is off).
struct LayerWeights {
  std::vector<float> attention_norm_w, attention_norm_b;  // [E]
  std::vector<float> wqkv_w;                              // [3E, E] rows: Q | K | V, head-major
  std::vector<float> wqkv_b;                              // [3E]
  std::vector<float> wo_w;                                // [E, E]
  std::vector<float> wo_b;                                // [E]
  std::vector<float> q_norm, k_norm;                      // [hd]
  std::vector<float> dw1;                                 // [E, C*K]  (file: [E,1,C,K])
  std::vector<float> qkw;                                 // [C, K, 2I, N] (file: [1,C,K,2I,N])
  std::vector<float> dd;                                  // [E, C*N]  (file: [E,1,C*N])
  std::vector<float> ffn_norm_w, ffn_norm_b;              // [E]
  std::vector<float> w1_w, w1_b;                          // [F, E], [F]
  std::vector<float> w3_w;                                // [F, E] (dcformer only)
  std::vector<float> w2_w, w2_b;                          // [E, F], [E]
};

struct ModelWeights {
  std::vector<float> tok_embeddings;  // [V, E]
  std::vector<LayerWeights> layers;
  std::vector<float> norm_w, norm_b;  // [E]
  std::vector<float> output;          // [V, E]

  size_t TotalFloats() const;
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// Every tensor a checkpoint for `config` must hold (fused wqkv form), with its file shape.
std::vector<TensorSpec> ExpectedTensors(const ModelConfig& config);

// Validates the checkpoint's names, shapes and dtypes against `config` (derived/dead keys
// listed in DCFORMER.md are ignored; any other missing, extra or misshapen tensor is an
// InvalidArgument naming it), then reads everything as fp32.
absl::StatusOr<ModelWeights> LoadModelWeights(const ModelConfig& config,
                                              CheckpointReader& reader);

}  // namespace dcf
