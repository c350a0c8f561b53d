// Writes a random-weight model directory (config.json + model.safetensors) for a given
// config: benchmarks at realistic shapes, tests that need models of their own, and
// models/dcformer-tiny (the default model, models/dcformer-kjv, is trained instead).
// Deterministic for a given seed on one standard library.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "engine/weights/dtype.h"
#include "nlohmann/json.hpp"

namespace dcf {

// How weights are drawn. kNormal: N(0, s^2) from one std::mt19937_64 (the default; what
// tests and the checked-in models use). kFastUniform: uniform with the same variance from a
// counter-based hash of (seed, tensor, element), on all cores: ~20x faster, for benchmark
// models of billions of parameters (values differ from kNormal's).
enum class RandomInit { kNormal, kFastUniform };

// `config_json` is written verbatim as config.json and must parse as a ModelConfig. `dtype`
// is F32, F16 or BF16 (InvalidArgument otherwise); ResourceExhausted when host memory cannot
// hold the tensor list or one tensor (the directory may then hold a partial model).
absl::Status WriteRandomModel(const std::string& dir, const nlohmann::json& config_json,
                              DType dtype, uint64_t seed, RandomInit init = RandomInit::kNormal);

// A small dcformer config.json with the given sizes (window_type null, qk-norm on).
nlohmann::json SmallDcFormerConfig(int dim, int n_layer, int n_head, int intermediate_size,
                                   int vocab_size, int context, int window);

}  // namespace dcf
