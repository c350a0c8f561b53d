// The CPU backend: fp32 math, OpenBLAS GEMMs, OpenMP threads over tokens. It is the oracle
// the CUDA backend is tested against, so it follows DCFORMER.md literally.
//
// Thread-compatibility: Forward and AllocateCache must not run concurrently (the engine loop
// is the only caller).
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "engine/kv/kv_layout.h"
#include "engine/model/backend.h"
#include "engine/model/model_weights.h"

namespace dcf {

class CpuBackend final : public Backend {
 public:
  // Takes ownership of the weights. InvalidArgument when the config exceeds what the kernels
  // support (n_head > 256).
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(const ModelConfig& config,
                                                            ModelWeights weights);

  const ModelConfig& config() const override { return config_; }
  std::string name() const override { return "cpu"; }
  size_t BytesPerBlock(LayerGroup g, int block_size) const override;
  absl::Status AllocateCache(const KvCacheShape& shape) override;
  absl::Status Forward(absl::Span<const ForwardSpan> spans, absl::Span<float> logits) override;

 private:
  CpuBackend(const ModelConfig& config, ModelWeights weights);

  absl::Status Validate(absl::Span<const ForwardSpan> spans, absl::Span<float> logits) const;
  // First row of (block, layer) in the cache of group `g`: [B, row] floats.
  float* CacheRows(LayerGroup g, int32_t block, int layer_in_group);
  void AttentionLayer(int layer, absl::Span<const ForwardSpan> spans);
  void FeedForward(int layer, const float* h, float* out);

  ModelConfig config_;
  ModelWeights weights_;
  KvRowLayout layout_;
  KvCacheShape cache_shape_;
  std::array<std::vector<float>, kNumLayerGroups> cache_;  // [blocks, layers_in_group, B, row]
  std::array<int, kNumLayerGroups> layers_in_group_{0, 0};

  // Per-step activations, resized to the step's T tokens.
  struct Scratch {
    std::vector<int32_t> span_of;              // [T]
    std::vector<int64_t> pos;                  // [T]
    std::vector<float> x, a, y;                // [T, E]
    std::vector<float> qkv;                    // [T, 3E]
    std::vector<float> u;                      // [T, C*K]
    std::vector<float> dw;                     // [T, C, 2I, N]
    std::vector<float> g;                      // [T, C*N]
    std::vector<float> rows;                   // [T, row]  fresh K | V | key terms
    std::vector<float> o;                      // [T, E]
    std::vector<float> ff1, ff3;               // [T, F]
    std::vector<float> rope_cos, rope_sin;     // [T, r/2]
  } s_;
};

}  // namespace dcf
