// dcformer-quantize: writes an int8 weight-only copy of a model directory
// (docs/QUANTIZATION.md). The row-major weight matrices (output, wqkv, wo, w1, w3, w2) become
// I8 tensors with BF16 scales "<name>_scale" [out, ceil(in / G)] beside them, quantized by
// the rule --weight-dtype int8 applies at load (engine/weights/int8_quant.h); every other
// tensor is copied in its stored dtype; config.json gains "quantization_config"; the other
// files of the directory (tokenizer, chat template) are copied.
//
//   dcformer-quantize --model DIR --out DIR [--group-size 64]
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "engine/common/flag_names.h"
#include "engine/execution/backend_options.h"
#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"
#include "engine/weights/int8_quant.h"
#include "engine/weights/safetensors_writer.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, "", "model directory to quantize (config.json + weights)");
ABSL_FLAG(std::string, out, "", "output directory (created; its model.safetensors replaced)");
ABSL_FLAG(int, group_size, dcf::kDefaultWeightGroupSize,
          "input columns per bf16 scale: 32, 64 or 128");

namespace {

int Fail(int code, const std::string& message) {
  std::cerr << "dcformer-quantize: " << message << "\n";
  return code;
}

// The matrices stored as I8: the row-major Linear weights (dw1 and dd are column-major in
// the file and stay float; the CPU backend quantizes them at load with the same group size).
bool IsQuantizedMatrix(const std::string& name) {
  for (const char* suffix : {"attention.wqkv.weight", "attention.wo.weight",
                             "feed_forward.w1.weight", "feed_forward.w2.weight",
                             "feed_forward.w3.weight"}) {
    if (absl::EndsWith(name, suffix)) return true;
  }
  return name == "output.weight";
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> arg_storage;
  std::vector<char*> rest = dcf::ParseToolCommandLine(
      argc, argv,
      "writes an int8 weight-only copy of a model directory (docs/QUANTIZATION.md)\n"
      "  dcformer-quantize --model DIR --out DIR [--group-size 64]",
      arg_storage);
  if (rest.size() > 1) return Fail(2, "unexpected argument '" + std::string(rest[1]) + "'");
  const std::string in_dir = absl::GetFlag(FLAGS_model), out_dir = absl::GetFlag(FLAGS_out);
  const int group = absl::GetFlag(FLAGS_group_size);
  if (in_dir.empty() || out_dir.empty()) return Fail(2, "give --model DIR and --out DIR");
  if (absl::Status s = dcf::ValidateWeightGroupSize(group); !s.ok()) {
    return Fail(2, "--group-size: " + std::string(s.message()));
  }
  std::error_code ec;
  if (std::filesystem::equivalent(in_dir, out_dir, ec)) {
    return Fail(2, "--out must differ from --model");
  }
  auto config = dcf::ModelConfig::FromFile(in_dir + "/config.json");
  if (!config.ok()) return Fail(1, config.status().ToString());
  if (config->int8_group_size > 0) return Fail(1, in_dir + " is already an int8 checkpoint");
  auto reader = dcf::OpenCheckpointDir(in_dir);
  if (!reader.ok()) return Fail(1, reader.status().ToString());
  dcf::WeightLoadOptions load;
  load.dtype = std::nullopt;  // as stored
  load.check_finite = true;   // a NaN would quantize its whole group to garbage
  auto weights = dcf::LoadModelWeights(*config, **reader, load);
  if (!weights.ok()) return Fail(1, weights.status().ToString());
  reader->reset();

  // Quantized copies live until the file is written (about half the float model's bytes).
  std::vector<dcf::StoredTensor> tensors;
  std::vector<std::vector<int8_t>> q_store;
  std::vector<std::vector<uint16_t>> scale_store;
  int64_t quantized = 0;
  for (auto& [name, t] : dcf::NamedTensors(*config, *weights)) {
    if (t->empty()) continue;
    if (!IsQuantizedMatrix(name)) {
      tensors.push_back({name, t->dtype(), t->shape(), t->data()});
      continue;
    }
    const int64_t out = t->shape()[0], in = t->shape()[1], groups = dcf::Int8Groups(in, group);
    std::vector<float> row(static_cast<size_t>(in));
    std::vector<int8_t>& q = q_store.emplace_back(static_cast<size_t>(out * in));
    std::vector<uint16_t>& s = scale_store.emplace_back(static_cast<size_t>(out * groups));
    for (int64_t o = 0; o < out; ++o) {
      dcf::ConvertToF32(t->dtype(), static_cast<const uint8_t*>(t->data()) + o * in * dcf::DTypeSize(t->dtype()),
                        in, row.data());
      dcf::QuantizeRowInt8(row.data(), in, group, &q[o * in], &s[o * groups]);
    }
    tensors.push_back({name, dcf::DType::kI8, {out, in}, q.data()});
    tensors.push_back({name + "_scale", dcf::DType::kBF16, {out, groups}, s.data()});
    ++quantized;
  }

  std::filesystem::create_directories(out_dir, ec);
  if (ec) return Fail(1, "cannot create " + out_dir + ": " + ec.message());
  // Every file but the weights and config.json is copied (tokenizer, chat template, docs).
  for (const auto& entry : std::filesystem::directory_iterator(in_dir)) {
    const std::string file = entry.path().filename().string();
    if (!entry.is_regular_file() || file == "config.json" ||
        absl::StartsWith(file, "model.safetensors") || absl::StartsWith(file, "pytorch_model") ||
        absl::EndsWith(file, ".safetensors") || absl::EndsWith(file, ".bin")) {
      continue;
    }
    std::filesystem::copy_file(entry.path(), out_dir + "/" + file,
                               std::filesystem::copy_options::overwrite_existing, ec);
    if (ec) return Fail(1, "cannot copy " + entry.path().string() + ": " + ec.message());
  }
  std::ifstream config_in(in_dir + "/config.json");
  std::stringstream config_text;
  config_text << config_in.rdbuf();
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(config_text.str());
  j["quantization_config"] = {{"quant_method", "dcformer-int8"}, {"group_size", group}};
  std::ofstream config_out(out_dir + "/config.json", std::ios::trunc);
  config_out << j.dump(2) << "\n";
  config_out.close();
  if (!config_out) return Fail(1, "cannot write " + out_dir + "/config.json");
  if (absl::Status s = dcf::WriteSafetensors(out_dir + "/model.safetensors", tensors); !s.ok()) {
    return Fail(1, s.ToString());
  }
  std::cout << "dcformer-quantize: " << out_dir << ": " << quantized
            << " matrices int8 in groups of " << group << ", " << tensors.size()
            << " tensors\n";
  return 0;
}
