#include "tests/unit/backends/engine_test_util.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <tuple>
#include <utility>

#include "engine/common/logging.h"
#include "engine/cpu/cpu_backend.h"
#if DCF_ENGINE_TEST_CUDA_SIM
#include "engine/cuda/cuda_backend_factory.h"
#endif
#include "engine/model/model_weights.h"
#include "engine/serving/sequence_runner.h"
#include "engine/weights/checkpoint.h"
#include "tests/testing/golden.h"

namespace dcf::engine_test {
namespace {

// A map key for Int8Matrices.
std::pair<int, bool> Key(Int8Matrices int8) { return {int8.group, int8.activations}; }

}  // namespace

std::unique_ptr<Backend> LoadBackend(BackendKind kind, bool corrupt, Int8Matrices int8) {
  const std::string dir = testing::GoldenDir(kModel);
  auto config = ModelConfig::FromFile(dir + "/config.json");
  DCF_CHECK(config.ok()) << config.status();
  auto reader = OpenCheckpointDir(dir);
  DCF_CHECK(reader.ok()) << reader.status();
  auto weights = LoadModelWeights(*config, **reader);  // float32
  DCF_CHECK(weights.ok()) << weights.status();
  if (corrupt) {
    Tensor& wo = weights->layers[1].wo_w;
    for (int64_t k = 6; k < wo.numel(); k += 7) wo.f32()[k] = std::nanf("");
  }
  DCF_CHECK(kind == BackendKind::kCpu || (kHaveCudaSim && kind == BackendKind::kCudaSim))
      << BackendKindName(kind);
  absl::StatusOr<std::unique_ptr<Backend>> backend;
  if (kind == BackendKind::kCpu) {
    CpuBackendOptions options;
    options.int8 = int8;
    auto cpu = CpuBackend::Create(*config, *std::move(weights), options);
    backend = cpu.ok() ? absl::StatusOr<std::unique_ptr<Backend>>(*std::move(cpu)) : cpu.status();
  } else {
#if DCF_ENGINE_TEST_CUDA_SIM
    BackendOptions o;
    o.dtype = DType::kF32;
    backend = cuda::sim::CreateBackend(*config, *std::move(weights), o);
#endif
  }
  DCF_CHECK(backend.ok()) << backend.status();
  return *std::move(backend);
}

std::string KindName(BackendKind k) {
  std::string n = BackendKindName(k);
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

std::vector<int32_t> RandomPrompt(int len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> p;
  for (int i = 0; i < len; ++i) p.push_back(static_cast<int32_t>(3 + rng() % 290));
  return p;
}

std::vector<int32_t> Reference(const std::vector<int32_t>& prompt, int max_new, BackendKind kind,
                               Int8Matrices int8) {
  static auto* backends =
      new std::map<std::pair<BackendKind, std::pair<int, bool>>, std::unique_ptr<Backend>>();
  static auto* cache =
      new std::map<std::tuple<std::vector<int32_t>, int, BackendKind, std::pair<int, bool>>,
                   std::vector<int32_t>>();
  auto key = std::make_tuple(prompt, max_new, kind, Key(int8));
  auto it = cache->find(key);
  if (it != cache->end()) return it->second;
  std::unique_ptr<Backend>& backend = (*backends)[{kind, Key(int8)}];
  if (backend == nullptr) backend = LoadBackend(kind, false, int8);
  auto runner = SequenceRunner::Create(backend.get());
  DCF_CHECK(runner.ok()) << runner.status();
  auto r = (*runner)->Greedy(prompt, max_new, 16);
  DCF_CHECK(r.ok()) << r.status();
  (*cache)[key] = r->tokens;
  return r->tokens;
}

GenerationRequest Greedy(const std::vector<int32_t>& prompt, int max_new) {
  GenerationRequest r;
  r.prompt_tokens = prompt;
  r.sampling.temperature = 0;
  r.stopping.max_new_tokens = max_new;
  r.output.text = false;
  return r;
}

std::unique_ptr<Engine> MakeEngine(EngineOptions options, const Tokenizer* tok, BackendKind kind,
                                   Int8Matrices int8) {
  auto e = Engine::Create(LoadBackend(kind, false, int8), tok, options);
  DCF_CHECK(e.ok()) << e.status();
  return std::move(*e);
}

const std::vector<Case> kGrowingCases = {{5, 150}, {6, 140}, {7, 130}, {40, 60}, {90, 20}, {1, 25}};

INSTANTIATE_TEST_SUITE_P(Backends, EngineBackendTest,
                         ::testing::ValuesIn(kHaveCudaSim
                                                 ? std::vector<BackendKind>{BackendKind::kCpu,
                                                                            BackendKind::kCudaSim}
                                                 : std::vector<BackendKind>{BackendKind::kCpu}),
                         [](const auto& info) { return KindName(info.param); });

}  // namespace dcf::engine_test
