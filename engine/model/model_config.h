// Hyper-parameters of a DCFormer / DCPythia checkpoint, parsed from its Hugging Face
// config.json (see shared docs DCFORMER.md section 1 and 5).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace dcf {

enum class Architecture { kDcFormer, kDcPythia };

// Which attention layers are local (sliding-window); the rest are global.
enum class WindowPattern {
  kNone,  // window_size null: every layer global
  kLG,    // window_type null or "LG": even layers local
  kLGLL,  // l % 4 in {0, 2, 3} local
  kLGL6,  // l % 8 != 1 local
};

// The two KV-cache layer groups. Every layer belongs to exactly one.
enum class LayerGroup { kGlobal = 0, kWindow = 1 };
inline constexpr int kNumLayerGroups = 2;

struct ModelConfig {
  Architecture architecture = Architecture::kDcFormer;
  int dim = 0;                // E
  int n_layer = 0;
  int n_head = 0;             // N
  int head_dim = 0;           // dim / n_head (the file's head_dim is ignored)
  int intermediate_size = 0;  // F
  int vocab_size = 0;         // rows of tok_embeddings / output
  int max_positions = 0;      // block_size, at most kMaxPositions
  double rope_base = 10000.0;
  double norm_eps = 1e-6;
  bool use_qk_norm = false;
  int window_size = 0;  // W; 0 when window_size is null
  WindowPattern window_pattern = WindowPattern::kNone;
  int rotary_dim = 0;  // r: head_dim, or int(head_dim * rotary_pct) for dcpythia
  bool parallel_residual = false;
  bool linear_bias = false;
  std::optional<int> bos_token_id;
  std::optional<int> eos_token_id;
  std::string torch_dtype;  // informational: the file's dtypes are what is loaded
  // > 0: a checkpoint written by dcformer-quantize, its row-major weight matrices int8 with
  // one bf16 scale per this many input columns (32, 64 or 128), from config.json's
  // "quantization_config": {"quant_method": "dcformer-int8", "group_size": G}
  // (docs/QUANTIZATION.md). 0: every tensor is float.
  int int8_group_size = 0;

  // The longest context (block_size) a config may name: 2^20 positions. Backends size
  // per-position tables by it (CUDA's RoPE tables: 2 x block_size x rotary_dim/2 floats), so
  // an absurd value must fail here, not as an allocation; published DCFormer checkpoints use
  // 2048 to 8192.
  static constexpr int kMaxPositions = 1 << 20;

  // DCMHA constants (fixed by the architecture).
  static constexpr int kComposeBranches = 4;  // C: pre-q, pre-k, post-q, post-k
  static constexpr int kRank = 2;             // I
  int dynamic_hidden() const { return 4 * n_head; }  // K = 4N

  bool IsLocalLayer(int layer) const;
  LayerGroup GroupOf(int layer) const {
    return IsLocalLayer(layer) ? LayerGroup::kWindow : LayerGroup::kGlobal;
  }
  // Number of layers in `group`, and the index of `layer` inside its group.
  int NumLayersIn(LayerGroup group) const;
  int IndexInGroup(int layer) const;

  std::string ArchitectureName() const;

  // Parses config.json text. Unknown model_type, unsupported values (n_local_heads != n_head,
  // dim not divisible by n_head, odd rotary dims, unknown window_type, ...) and missing keys
  // are InvalidArgument errors whose message names the key.
  static absl::StatusOr<ModelConfig> FromJson(const std::string& json_text);
  static absl::StatusOr<ModelConfig> FromFile(const std::string& path);
};

}  // namespace dcf
