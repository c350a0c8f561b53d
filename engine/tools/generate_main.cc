// dcformer-generate: offline greedy generation with the CPU engine.
//
//   dcformer-generate --model DIR --prompt-ids 1,2,3 --max-new-tokens N [--json]
//
// Prints the generated ids comma-separated, or with --json one object
// {"tokens": [...], "logprobs": [...]}. Bad arguments or models: a message on stderr and
// exit code 2 (usage) or 1 (runtime failure).
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "engine/common/flag_names.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "engine/common/logging.h"
#include "engine/model/model_loader.h"
#include "engine/model/sequence_runner.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, DCF_DEFAULT_MODEL_DIR, "model directory (config.json + weights)");
ABSL_FLAG(std::string, prompt_ids, "", "prompt as comma-separated token ids");
ABSL_FLAG(int, max_new_tokens, 16, "number of tokens to generate");
ABSL_FLAG(int, prefill_chunk, 512, "prefill the prompt in chunks of this many tokens");
ABSL_FLAG(bool, json, false, "print {\"tokens\": [...], \"logprobs\": [...]}");

namespace {

int Fail(int code, absl::string_view message) {
  std::cerr << "dcformer-generate: " << message << "\n";
  return code;
}

absl::StatusOr<std::vector<int32_t>> ParseIds(absl::string_view text) {
  std::vector<int32_t> ids;
  for (absl::string_view piece : absl::StrSplit(text, ',')) {
    piece = absl::StripAsciiWhitespace(piece);
    int32_t id;
    if (piece.empty() || !absl::SimpleAtoi(piece, &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--prompt-ids: '", piece, "' is not an integer token id"));
    }
    ids.push_back(id);
  }
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "offline greedy generation\n  dcformer-generate --model DIR --prompt-ids 1,2,3 "
      "--max-new-tokens N [--json]");
  std::vector<std::string> arg_storage;
  std::vector<char*> args = dcf::NormalizeFlagNames(argc, argv, arg_storage);
  std::vector<char*> rest = absl::ParseCommandLine(argc, args.data());
  if (rest.size() > 1) return Fail(2, absl::StrCat("unexpected argument '", rest[1], "'"));
  if (absl::GetFlag(FLAGS_max_new_tokens) < 0) {
    return Fail(2, "--max-new-tokens must be >= 0");
  }
  if (absl::GetFlag(FLAGS_prefill_chunk) <= 0) return Fail(2, "--prefill-chunk must be > 0");
  if (absl::GetFlag(FLAGS_prompt_ids).empty()) return Fail(2, "give --prompt-ids");
  auto prompt = ParseIds(absl::GetFlag(FLAGS_prompt_ids));
  if (!prompt.ok()) return Fail(2, prompt.status().message());

  auto model = dcf::LoadModel(absl::GetFlag(FLAGS_model));
  if (!model.ok()) return Fail(1, model.status().ToString());
  auto runner = dcf::SequenceRunner::Create(model->backend.get());
  if (!runner.ok()) return Fail(1, runner.status().ToString());
  auto result = (*runner)->Greedy(*prompt, absl::GetFlag(FLAGS_max_new_tokens),
                                  absl::GetFlag(FLAGS_prefill_chunk));
  if (!result.ok()) return Fail(1, result.status().ToString());

  if (absl::GetFlag(FLAGS_json)) {
    nlohmann::ordered_json j;
    j["tokens"] = result->tokens;
    j["logprobs"] = result->logprobs;
    std::cout << j.dump() << "\n";
  } else {
    std::cout << absl::StrJoin(result->tokens, ",") << "\n";
  }
  return 0;
}
