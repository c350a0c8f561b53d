// Shared helpers for the tokenizer tests: the GPT-2 reference cases and tokenizer instances.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace dcf::testing_util {

inline std::string Gpt2Dir() { return std::string(DCF_TEST_DATA_DIR) + "/tokenizer/gpt2"; }

struct Gpt2Case {
  std::string text;
  std::vector<int32_t> ids;
  bool roundtrip;
};

// Every line of a cases file: {"text": ..., "ids": [...], "roundtrip": bool}.
inline std::vector<Gpt2Case> LoadCasesFile(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "missing " << path;
  std::vector<Gpt2Case> cases;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const nlohmann::json j = nlohmann::json::parse(line);
    cases.push_back({j.at("text").get<std::string>(), j.at("ids").get<std::vector<int32_t>>(),
                     j.value("roundtrip", true)});
  }
  return cases;
}

inline std::vector<Gpt2Case> LoadGpt2Cases() {
  std::vector<Gpt2Case> cases = LoadCasesFile(Gpt2Dir() + "/cases.jsonl");
  EXPECT_GE(cases.size(), 20u);
  return cases;
}

// Loaded once per test binary; Tokenizer is thread-safe and immutable.
inline const Tokenizer& Gpt2() {
  static const Tokenizer* tok = [] {
    auto t = Tokenizer::FromFile(Gpt2Dir() + "/tokenizer.json");
    if (!t.ok()) {
      ADD_FAILURE() << t.status();
      std::abort();
    }
    return t->release();
  }();
  return *tok;
}

}  // namespace dcf::testing_util
