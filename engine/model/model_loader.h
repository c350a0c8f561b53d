// Loads a model directory (config.json + weights) into a ready backend.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/backend.h"

namespace dcf {

struct LoadedModel {
  ModelConfig config;
  std::unique_ptr<Backend> backend;
};

// Parses `dir`/config.json, validates and loads the weights (see LoadModelWeights) and builds
// the CPU backend. Errors name the file, key or tensor at fault.
absl::StatusOr<LoadedModel> LoadModel(const std::string& dir);

}  // namespace dcf
