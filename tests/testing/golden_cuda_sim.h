// A golden model (tests/testing/golden.h) on the CUDA backend under cuda-sim, in float32: the
// backend the cuda-sim backend tests drive directly (its plans, graphs and traces).
#pragma once

#include <memory>
#include <string>

#include "engine/cuda/cuda_backend.h"
#include "engine/model/model_weights.h"
#include "engine/weights/checkpoint.h"
#include "gtest/gtest.h"
#include "tests/testing/golden.h"

namespace dcf::testing {

// Null, with the failure recorded, when any step of loading fails.
inline std::unique_ptr<cuda::CudaBackend> LoadGoldenCudaSim(const std::string& model) {
  const std::string dir = GoldenDir(model);
  auto config = ModelConfig::FromFile(dir + "/config.json");
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return nullptr;
  auto reader = OpenCheckpointDir(dir);
  EXPECT_TRUE(reader.ok()) << reader.status();
  if (!reader.ok()) return nullptr;
  auto weights = LoadModelWeights(*config, **reader);
  EXPECT_TRUE(weights.ok()) << weights.status();
  if (!weights.ok()) return nullptr;
  BackendOptions o;
  o.dtype = DType::kF32;
  auto backend = cuda::CudaBackend::Create(*config, *std::move(weights), o);
  EXPECT_TRUE(backend.ok()) << backend.status();
  if (!backend.ok()) return nullptr;
  return *std::move(backend);
}

// A test name for a golden model parameter: its name with '-' as '_'.
inline std::string GoldenParamName(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param;
  for (char& ch : n) {
    if (ch == '-') ch = '_';
  }
  return n;
}

}  // namespace dcf::testing
