// dcformer-make-model: writes a random-weight DCFormer checkpoint (config.json +
// model.safetensors) of any size, for the default model, benchmarks and tests.
//
//   dcformer-make-model --out DIR [--dim 64 --n-layer 2 --n-head 4 --ffn 128 --vocab 50257
//                        --context 1024 --window 64 --dtype F16 --seed 1 --init normal|fast]
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "engine/common/flag_names.h"
#include "engine/model/random_model.h"

ABSL_FLAG(std::string, out, "", "output directory (created)");
ABSL_FLAG(int, dim, 64, "model width E");
ABSL_FLAG(int, n_layer, 2, "layers (at most 10000)");
ABSL_FLAG(int, n_head, 4, "heads");
ABSL_FLAG(int, ffn, 128, "intermediate size");
ABSL_FLAG(int, vocab, 50257, "vocabulary size");
ABSL_FLAG(int, context, 1024, "max positions (config block_size)");
ABSL_FLAG(int, window, 64, "sliding window of local layers; 0 = all layers global");
ABSL_FLAG(std::string, dtype, "F16", "storage dtype: F32, F16 or BF16");
ABSL_FLAG(uint64_t, seed, 1, "random seed");
ABSL_FLAG(std::string, init, "normal",
          "normal: N(0, 1/fan_in) weights (the default); fast: uniform weights of the same "
          "variance from a counter-based hash on all cores, for multi-billion-parameter "
          "benchmark models");

int main(int argc, char** argv) {
  std::vector<std::string> arg_storage;
  std::vector<char*> rest = dcf::ParseToolCommandLine(
      argc, argv,
      "writes a random-weight DCFormer model directory (config.json + model.safetensors)\n"
      "  dcformer-make-model --out DIR [--dim 64 --n-layer 2 --n-head 4 --ffn 128 --vocab 50257 "
      "--context 1024 --window 64 --dtype F16 --seed 1]",
      arg_storage);
  if (rest.size() > 1) {
    std::cerr << "dcformer-make-model: unexpected argument '" << rest[1] << "'\n";
    return 2;
  }
  if (absl::GetFlag(FLAGS_out).empty()) {
    std::cerr << "dcformer-make-model: give --out DIR\n";
    return 2;
  }
  for (const auto& [name, value] : {std::pair<const char*, int>{"--dim", absl::GetFlag(FLAGS_dim)},
                                    {"--n-layer", absl::GetFlag(FLAGS_n_layer)},
                                    {"--n-head", absl::GetFlag(FLAGS_n_head)},
                                    {"--ffn", absl::GetFlag(FLAGS_ffn)},
                                    {"--vocab", absl::GetFlag(FLAGS_vocab)},
                                    {"--context", absl::GetFlag(FLAGS_context)}}) {
    if (value <= 0) {
      std::cerr << "dcformer-make-model: " << name << " must be positive\n";
      return 2;
    }
  }
  // Far beyond any real model (DCPythia-6.9B has 32 layers), and bounded so that a typo fails
  // at once: a million layers spent minutes building a tensor list of 23 million names whose
  // safetensors header no loader would read (over its 100 MiB limit).
  constexpr int kMaxLayers = 10000;
  if (absl::GetFlag(FLAGS_n_layer) > kMaxLayers) {
    std::cerr << "dcformer-make-model: --n-layer must be at most " << kMaxLayers << "\n";
    return 2;
  }
  if (absl::GetFlag(FLAGS_window) < 0) {
    std::cerr << "dcformer-make-model: --window must be >= 0\n";
    return 2;
  }
  // Random weights are floats: an I8 file would have no scales and no quantization_config
  // (dcformer-quantize writes int8 checkpoints).
  auto dtype = dcf::ParseSafetensorsDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok() ||
      (*dtype != dcf::DType::kF32 && *dtype != dcf::DType::kF16 && *dtype != dcf::DType::kBF16)) {
    std::cerr << "dcformer-make-model: --dtype must be F32, F16 or BF16, not '"
              << absl::GetFlag(FLAGS_dtype) << "' (dcformer-quantize writes int8 models)\n";
    return 2;
  }
  auto config = dcf::SmallDcFormerConfig(absl::GetFlag(FLAGS_dim), absl::GetFlag(FLAGS_n_layer),
                                         absl::GetFlag(FLAGS_n_head), absl::GetFlag(FLAGS_ffn),
                                         absl::GetFlag(FLAGS_vocab), absl::GetFlag(FLAGS_context),
                                         absl::GetFlag(FLAGS_window));
  config["torch_dtype"] = *dtype == dcf::DType::kF32   ? "float32"
                          : *dtype == dcf::DType::kF16 ? "float16"
                                                       : "bfloat16";
  const std::string init = absl::GetFlag(FLAGS_init);
  if (init != "normal" && init != "fast") {
    std::cerr << "dcformer-make-model: --init must be normal or fast\n";
    return 2;
  }
  const absl::Status st = dcf::WriteRandomModel(
      absl::GetFlag(FLAGS_out), config, *dtype, absl::GetFlag(FLAGS_seed),
      init == "fast" ? dcf::RandomInit::kFastUniform : dcf::RandomInit::kNormal);
  if (!st.ok()) {
    std::cerr << "dcformer-make-model: " << st << "\n";
    return 1;
  }
  // What was written, so that a run is not silent (and a wrong shape shows at once).
  std::error_code size_error;
  const std::string weights = absl::GetFlag(FLAGS_out) + "/model.safetensors";
  const uintmax_t bytes = std::filesystem::file_size(weights, size_error);
  std::cout << "wrote " << absl::GetFlag(FLAGS_out) << "/config.json and " << weights << " ("
            << (size_error ? std::string("size unknown")
                           : absl::StrFormat("%.1f MB", static_cast<double>(bytes) / 1e6))
            << ", " << absl::GetFlag(FLAGS_dtype) << ", " << init << " init): dim "
            << absl::GetFlag(FLAGS_dim) << ", " << absl::GetFlag(FLAGS_n_layer) << " layers, "
            << absl::GetFlag(FLAGS_n_head) << " heads, ffn " << absl::GetFlag(FLAGS_ffn)
            << ", vocab " << absl::GetFlag(FLAGS_vocab) << ", context "
            << absl::GetFlag(FLAGS_context) << ", window " << absl::GetFlag(FLAGS_window)
            << ", seed " << absl::GetFlag(FLAGS_seed) << "\n";
  return 0;
}
