// Test helpers: access to the reference outputs in tests/data/golden (see its README.md).
#pragma once

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace dcf::testing {

// The golden checkpoints: $DCF_TEST_DATA_DIR/golden when that is set (a relocated test
// binary, e.g. in the GPU-check bundle), else the source tree's tests/data/golden.
inline std::string GoldenDir(const std::string& name) {
  const char* dir = std::getenv("DCF_TEST_DATA_DIR");
  return std::string(dir != nullptr && *dir != '\0' ? dir : DCF_TEST_DATA_DIR) + "/golden/" + name;
}

inline const std::vector<std::string>& GoldenCases() {
  static const std::vector<std::string> cases = {
      "dcformer-f32-short-prompt", "dcformer-f32-long-prompt", "dcpythia-f16-bin"};
  return cases;
}

struct Golden {
  std::vector<int32_t> prompt, greedy, sequence;
  std::vector<std::vector<double>> logits;  // [len(sequence), vocab]
  std::vector<double> greedy_logprobs;
};

inline Golden LoadGolden(const std::string& name) {
  std::ifstream in(GoldenDir(name) + "/golden.json");
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(ss.str());
  Golden g;
  g.prompt = j.at("prompt").get<std::vector<int32_t>>();
  g.greedy = j.at("greedy").get<std::vector<int32_t>>();
  g.sequence = j.at("sequence").get<std::vector<int32_t>>();
  g.logits = j.at("logits").get<std::vector<std::vector<double>>>();
  g.greedy_logprobs = j.at("greedy_logprobs").get<std::vector<double>>();
  return g;
}

}  // namespace dcf::testing
