// What the fuzz targets share: the GPT-2 tokenizer of the test data, the limits a 1024-token
// GPT-2 model resolves, and the property checks that abort (libFuzzer reports a crash).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "engine/serving/request_validator.h"
#include "engine/tokenizer/tokenizer.h"

namespace dcf::fuzz {

// tests/data/tokenizer/gpt2/tokenizer.json, loaded once.
inline const Tokenizer& Gpt2() {
  static const Tokenizer* tok = [] {
    const std::string path = std::string(DCF_TEST_DATA_DIR) + "/tokenizer/gpt2/tokenizer.json";
    auto t = Tokenizer::FromFile(path);
    if (!t.ok()) {
      std::fprintf(stderr, "cannot load %s: %s\n", path.c_str(), t.status().ToString().c_str());
      std::abort();
    }
    return t->release();
  }();
  return *tok;
}

// As Engine::limits() resolves them for a 1024-token GPT-2 model with its tokenizer.
inline RequestLimits Gpt2Limits() {
  RequestLimits limits;
  limits.vocab_size = 50257;
  limits.context = 1024;
  limits.max_prompt_tokens = 1024;
  limits.max_new_tokens_limit = 1024;
  limits.default_max_new_tokens = 256;
  limits.eos_token_id = 50256;
  limits.tokenizer = &Gpt2();
  return limits;
}

// Aborts with "<target>: property violated: <what> (<status>)" unless `cond`.
inline void Check(bool cond, const char* target, const char* what,
                  const absl::Status& status = absl::OkStatus()) {
  if (!cond) {
    std::fprintf(stderr, "%s: property violated: %s (%s)\n", target, what,
                 status.ToString().c_str());
    std::abort();
  }
}

// A rejection must carry a message and be INVALID_ARGUMENT or OUT_OF_RANGE.
inline void CheckRejection(const absl::Status& s, const char* target, const char* stage) {
  Check(!s.message().empty(), target, stage, s);
  Check(s.code() == absl::StatusCode::kInvalidArgument ||
            s.code() == absl::StatusCode::kOutOfRange,
        target, stage, s);
}

}  // namespace dcf::fuzz
