#include "engine/model/model_config.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "engine/common/file_util.h"
#include "engine/common/status_macros.h"
#include "engine/weights/int8_quant.h"
#include "nlohmann/json.hpp"

namespace dcf {
namespace {

using Json = nlohmann::json;

absl::Status KeyError(absl::string_view key, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("config.json: '", key, "' ", what));
}

absl::StatusOr<int> RequiredPositiveInt(const Json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return KeyError(key, "is missing");
  if (!it->is_number_integer()) return KeyError(key, "must be an integer");
  const int64_t v = it->get<int64_t>();
  if (v <= 0 || v > (int64_t{1} << 30)) return KeyError(key, absl::StrCat("has bad value ", v));
  return static_cast<int>(v);
}

absl::StatusOr<double> NumberOr(const Json& j, const char* key, double fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number()) return KeyError(key, "must be a number");
  const double v = it->get<double>();
  if (!std::isfinite(v)) return KeyError(key, "must be finite");
  return v;
}

absl::StatusOr<bool> BoolOr(const Json& j, const char* key, bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return KeyError(key, "must be true or false");
  return it->get<bool>();
}

absl::StatusOr<std::optional<int>> OptionalTokenId(const Json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<int>();
  const Json* v = &*it;
  if (it->is_array()) {  // some configs list several; the first is the canonical one
    if (it->empty()) return std::optional<int>();
    v = &(*it)[0];
  }
  if (!v->is_number_integer()) return KeyError(key, "must be an integer");
  const int64_t id = v->get<int64_t>();
  if (id < 0 || id > std::numeric_limits<int32_t>::max()) {
    return KeyError(key, absl::StrCat("has bad value ", id));
  }
  return std::optional<int>(static_cast<int>(id));
}

}  // namespace

bool ModelConfig::IsLocalLayer(int layer) const {
  switch (window_pattern) {
    case WindowPattern::kNone: return false;
    case WindowPattern::kLG: return layer % 2 == 0;
    case WindowPattern::kLGLL: return layer % 4 != 1;
    case WindowPattern::kLGL6: return layer % 8 != 1;
  }
  return false;
}

int ModelConfig::NumLayersIn(LayerGroup group) const {
  int n = 0;
  for (int l = 0; l < n_layer; ++l) n += GroupOf(l) == group;
  return n;
}

int ModelConfig::IndexInGroup(int layer) const {
  int n = 0;
  for (int l = 0; l < layer; ++l) n += GroupOf(l) == GroupOf(layer);
  return n;
}

std::string ModelConfig::ArchitectureName() const {
  return architecture == Architecture::kDcFormer ? "dcformer" : "dcpythia";
}

absl::StatusOr<ModelConfig> ModelConfig::FromJson(const std::string& json_text) {
  Json j = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError("config.json: not a valid JSON object");
  }
  ModelConfig c;
  auto mt = j.find("model_type");
  if (mt == j.end() || !mt->is_string()) return KeyError("model_type", "is missing");
  const std::string model_type = mt->get<std::string>();
  if (model_type == "dcformer") {
    c.architecture = Architecture::kDcFormer;
  } else if (model_type == "dcpythia") {
    c.architecture = Architecture::kDcPythia;
  } else {
    return KeyError("model_type", absl::StrCat("'", model_type,
                                               "' is not supported (dcformer, dcpythia)"));
  }
  ASSIGN_OR_RETURN(c.dim, RequiredPositiveInt(j, "dim"));
  ASSIGN_OR_RETURN(c.n_layer, RequiredPositiveInt(j, "n_layer"));
  ASSIGN_OR_RETURN(c.n_head, RequiredPositiveInt(j, "n_head"));
  ASSIGN_OR_RETURN(c.intermediate_size, RequiredPositiveInt(j, "intermediate_size"));
  ASSIGN_OR_RETURN(c.vocab_size, RequiredPositiveInt(j, "vocab_size"));
  ASSIGN_OR_RETURN(c.max_positions, RequiredPositiveInt(j, "block_size"));
  if (c.max_positions > kMaxPositions) {
    return KeyError("block_size", absl::StrCat("is ", c.max_positions, ", more than the ",
                                               kMaxPositions, " positions this engine serves"));
  }
  if (c.dim % c.n_head != 0) {
    return KeyError("dim", absl::StrCat(c.dim, " is not divisible by n_head ", c.n_head));
  }
  c.head_dim = c.dim / c.n_head;
  if (auto it = j.find("n_local_heads"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() != c.n_head) {
      return KeyError("n_local_heads", "must equal n_head (grouped-query attention is not "
                                       "supported)");
    }
  }
  ASSIGN_OR_RETURN(c.rope_base, NumberOr(j, "rope_base", 10000.0));
  if (c.rope_base <= 0) return KeyError("rope_base", "must be positive");
  ASSIGN_OR_RETURN(c.norm_eps, NumberOr(j, "norm_eps", 1e-6));
  if (c.norm_eps <= 0) return KeyError("norm_eps", "must be positive");
  ASSIGN_OR_RETURN(c.use_qk_norm, BoolOr(j, "use_qk_norm", false));
  if (auto it = j.find("use_dcmha"); it != j.end() && it->is_boolean() && !it->get<bool>()) {
    return KeyError("use_dcmha", "false is not supported (this engine serves DCMHA models)");
  }
  if (auto it = j.find("query_wise"); it != j.end() && it->is_boolean() && it->get<bool>()) {
    return KeyError("query_wise", "true is not supported");
  }
  if (auto it = j.find("n_kv_heads"); it != j.end() && !it->is_null() &&
                                      !(it->is_number_integer() && it->get<int>() == c.n_head)) {
    return KeyError("n_kv_heads", "must equal n_head");
  }

  // Sliding window.
  auto ws = j.find("window_size");
  if (ws == j.end() || ws->is_null()) {
    c.window_pattern = WindowPattern::kNone;
  } else {
    ASSIGN_OR_RETURN(c.window_size, RequiredPositiveInt(j, "window_size"));
    auto wt = j.find("window_type");
    std::string type = (wt == j.end() || wt->is_null()) ? "LG" : "";
    if (type.empty()) {
      if (!wt->is_string()) return KeyError("window_type", "must be a string or null");
      type = wt->get<std::string>();
    }
    if (type == "LG") {
      c.window_pattern = WindowPattern::kLG;
    } else if (type == "LGLL") {
      c.window_pattern = WindowPattern::kLGLL;
    } else if (type == "LGL6") {
      c.window_pattern = WindowPattern::kLGL6;
    } else {
      return KeyError("window_type",
                      absl::StrCat("'", type, "' is not supported (null, LG, LGLL, LGL6)"));
    }
  }

  c.rotary_dim = c.head_dim;
  if (c.architecture == Architecture::kDcPythia) {
    ASSIGN_OR_RETURN(const double pct, NumberOr(j, "rotary_pct", 0.25));
    if (pct <= 0 || pct > 1) return KeyError("rotary_pct", "must be in (0, 1]");
    c.rotary_dim = static_cast<int>(c.head_dim * pct);
    ASSIGN_OR_RETURN(c.parallel_residual, BoolOr(j, "use_parallel_residual", true));
    ASSIGN_OR_RETURN(c.linear_bias, BoolOr(j, "use_linear_bias", true));
    if (!c.parallel_residual) {
      return KeyError("use_parallel_residual", "false is not supported for dcpythia");
    }
  } else {
    for (const char* key : {"use_parallel_residual", "use_linear_bias"}) {
      ASSIGN_OR_RETURN(const bool on, BoolOr(j, key, false));
      if (on) return KeyError(key, "true is not supported for dcformer");
    }
  }
  if (c.rotary_dim % 2 != 0 || c.rotary_dim <= 0) {
    return KeyError("rotary_pct", absl::StrCat("gives rotary dims ", c.rotary_dim,
                                               ", which must be even and positive"));
  }
  if (auto it = j.find("tie_word_embeddings"); it != j.end() && it->is_boolean() &&
                                                it->get<bool>()) {
    return KeyError("tie_word_embeddings", "true is not supported (output.weight is separate)");
  }
  ASSIGN_OR_RETURN(c.bos_token_id, OptionalTokenId(j, "bos_token_id"));
  ASSIGN_OR_RETURN(c.eos_token_id, OptionalTokenId(j, "eos_token_id"));
  if (auto it = j.find("torch_dtype"); it != j.end() && it->is_string()) {
    c.torch_dtype = it->get<std::string>();
  }
  if (auto it = j.find("quantization_config"); it != j.end() && !it->is_null()) {
    auto method = it->is_object() ? it->find("quant_method") : it->end();
    if (!it->is_object() || method == it->end() || !method->is_string() ||
        method->get<std::string>() != "dcformer-int8") {
      return KeyError("quantization_config",
                      "must be {\"quant_method\": \"dcformer-int8\", \"group_size\": 32|64|128} "
                      "(the only quantized format this engine reads)");
    }
    ASSIGN_OR_RETURN(c.int8_group_size, RequiredPositiveInt(*it, "group_size"));
    if (!ValidInt8GroupSize(c.int8_group_size)) {
      return KeyError("quantization_config",
                      absl::StrCat("group_size ", c.int8_group_size, " (choose 32, 64 or 128)"));
    }
  }
  return c;
}

absl::StatusOr<ModelConfig> ModelConfig::FromFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  auto config = FromJson(text);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(path, ": ", config.status().message()));
  }
  return config;
}

}  // namespace dcf
