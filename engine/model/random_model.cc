#include "engine/model/random_model.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <new>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"
#include "engine/weights/safetensors_writer.h"

namespace dcf {

nlohmann::json SmallDcFormerConfig(int dim, int n_layer, int n_head, int intermediate_size,
                                   int vocab_size, int context, int window) {
  return {{"model_type", "dcformer"},
          {"architectures", {"DCFormer"}},
          {"dim", dim},
          {"n_layer", n_layer},
          {"n_head", n_head},
          {"n_local_heads", n_head},
          {"head_dim", dim / n_head},
          {"intermediate_size", intermediate_size},
          {"vocab_size", vocab_size},
          {"block_size", context},
          {"window_size", window > 0 ? nlohmann::json(window) : nlohmann::json(nullptr)},
          {"window_type", nullptr},
          {"use_qk_norm", true},
          {"rope_base", 10000.0},
          {"norm_eps", 1e-6},
          {"use_dcmha", true},
          {"query_wise", false},
          {"tie_word_embeddings", false},
          {"torch_dtype", "float32"}};
}

namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// dst[j] = mean + uniform(-a, a) with a = stddev * sqrt(3), element j's value a function of
// (key, j) alone, filled by all cores.
void FillFastUniform(uint64_t key, double mean, double stddev, absl::Span<float> dst) {
  const float a = static_cast<float>(stddev * std::sqrt(3.0));
  const size_t n = dst.size();
  auto work = [&](size_t begin, size_t end) {
    for (size_t j = begin; j < end; ++j) {
      const uint64_t h = SplitMix64(key ^ (j * 0xD1B54A32D192ED03ull));
      const float u = static_cast<float>(h >> 40) * (2.0f / 16777216.0f) - 1.0f;  // [-1, 1)
      dst[j] = static_cast<float>(mean) + a * u;
    }
  };
  const size_t threads =
      n < (size_t{1} << 20) ? 1 : std::max<size_t>(1, std::thread::hardware_concurrency());
  if (threads == 1) return work(0, n);
  std::vector<std::thread> pool;
  const size_t chunk = (n + threads - 1) / threads;
  for (size_t t = 0; t < threads; ++t) {
    pool.emplace_back(work, std::min(n, t * chunk), std::min(n, (t + 1) * chunk));
  }
  for (std::thread& th : pool) th.join();
}

}  // namespace

namespace {

absl::Status WriteRandomModelFiles(const std::string& dir, const nlohmann::json& config_json,
                                   const ModelConfig& config, DType dtype, uint64_t seed,
                                   RandomInit init) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir));
  {
    std::ofstream out(dir + "/config.json");
    out << config_json.dump(2) << "\n";
    if (!out) return absl::DataLossError(absl::StrCat("cannot write ", dir, "/config.json"));
  }
  const std::vector<TensorSpec> specs = ExpectedTensors(config);
  std::vector<TensorShape> shapes;
  for (const TensorSpec& s : specs) shapes.push_back({s.name, s.shape});
  std::mt19937_64 rng(seed);
  auto fill = [&](size_t i, absl::Span<float> dst) {
    const TensorSpec& s = specs[i];
    const bool is_norm =
        absl::EndsWith(s.name, "norm.weight") || absl::EndsWith(s.name, "norm.scale");
    // Scale by fan-in so activations stay O(1) through the layers.
    double fan_in = static_cast<double>(s.shape.back());
    if (absl::EndsWith(s.name, "dw1") || absl::EndsWith(s.name, "dd")) fan_in = s.shape[0];
    if (absl::EndsWith(s.name, "qkw")) fan_in = s.shape[2];
    double stddev = 1.0 / std::sqrt(fan_in);
    if (absl::StartsWith(s.name, "tok_embeddings")) stddev = 1.0;
    if (absl::EndsWith(s.name, "bias")) stddev = 0.02;
    if (init == RandomInit::kFastUniform) {
      FillFastUniform(SplitMix64(seed) ^ SplitMix64(i + 1), is_norm ? 1.0 : 0.0,
                      is_norm ? 0.1 * stddev : stddev, dst);
      return;
    }
    std::normal_distribution<float> dist(0.0f, static_cast<float>(stddev));
    for (float& v : dst) v = is_norm ? 1.0f + 0.1f * dist(rng) : dist(rng);
  };
  return WriteSafetensors(dir + "/model.safetensors", shapes, dtype, fill);
}

}  // namespace

absl::Status WriteRandomModel(const std::string& dir, const nlohmann::json& config_json,
                              DType dtype, uint64_t seed, RandomInit init) {
  if (dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("a random model is stored as F32, F16 or BF16, not ", DTypeName(dtype)));
  }
  ASSIGN_OR_RETURN(const ModelConfig config, ModelConfig::FromJson(config_json.dump()));
  // The tensor list and each tensor's buffer are allocated whole: a model too large for
  // host memory is an error, not an uncaught std::bad_alloc.
  try {
    return WriteRandomModelFiles(dir, config_json, config, dtype, seed, init);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("not enough host memory to write a model of ", config.n_layer, " layers, dim ",
                     config.dim, ", intermediate size ", config.intermediate_size, ", vocab ",
                     config.vocab_size, " (", dir, " may hold a partial model)"));
  }
}

}  // namespace dcf
