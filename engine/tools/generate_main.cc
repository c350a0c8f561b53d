// dcformer-generate: offline greedy generation on any backend, and a tokenize tool.
//
//   dcformer-generate --model DIR --prompt-ids 1,2,3 --max-new-tokens N [--json]
//                     [--backend auto|cpu|cuda|cuda-sim] [--dtype float32|bfloat16|float16]
//   dcformer-generate --model DIR --prompt "text" --max-new-tokens N [--json]
//   dcformer-generate --tokenizer FILE --tokenize < text.txt
//   dcformer-generate --model DIR --score text.txt
//
// Prints the generated ids comma-separated (and, with a tokenizer, the generated text on a
// second line), or with --json one object {"tokens": [...], "logprobs": [...], "backend":
// "cpu", "dtype": "float32"} (plus "text" with a tokenizer; backend and dtype are what
// actually ran). Generation stops at the tokenizer's EOS (<|endoftext|>) unless
// --ignore-eos; models without a tokenizer have no EOS. --tokenize prints the ids of stdin as
// one JSON array. --score prints the model's perplexity on a UTF-8 text file as JSON (see
// Score). Bad arguments or models: a message on stderr and exit code 2 (usage) or 1
// (runtime failure).
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_join.h"
#include "engine/backends/backend_factory.h"
#include "engine/backends/backend_flags.h"
#include "engine/common/file_util.h"
#include "engine/common/flag_names.h"
#include "engine/common/id_list.h"
#include "engine/common/logging.h"
#include "engine/common/utf8.h"
#include "engine/sampling/token_sampler.h"
#include "engine/serving/engine.h"
#include "engine/serving/request_validator.h"
#include "engine/serving/sequence_runner.h"
#include "engine/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model, DCF_DEFAULT_MODEL_DIR, "model directory (config.json + weights)");
ABSL_FLAG(std::string, prompt_ids, "", "prompt as comma-separated token ids");
ABSL_FLAG(int, max_new_tokens, 16, "number of tokens to generate");
ABSL_FLAG(int, prefill_chunk, 512, "prefill the prompt in chunks of this many tokens");
ABSL_FLAG(bool, json, false, "print {\"tokens\": [...], \"logprobs\": [...]}");
ABSL_FLAG(std::string, prompt, "", "prompt text (needs a tokenizer)");
ABSL_FLAG(std::string, tokenizer, "",
          "tokenizer.json to use (default: the model directory's tokenizer, if any)");
ABSL_FLAG(bool, tokenize, false, "print the ids of stdin's UTF-8 text as a JSON array and exit");
ABSL_FLAG(bool, ignore_eos, false, "do not stop at the tokenizer's end-of-text token");
ABSL_FLAG(std::string, score, "",
          "print the model's perplexity on this UTF-8 text file as JSON and exit");

namespace {

int Fail(int code, absl::string_view message) {
  std::cerr << "dcformer-generate: " << message << "\n";
  return code;
}

// The explicit --tokenizer file, else the model directory's tokenizer, else none.
absl::StatusOr<std::unique_ptr<dcf::Tokenizer>> LoadTokenizer(const std::string& model_dir) {
  const std::string explicit_path = absl::GetFlag(FLAGS_tokenizer);
  if (!explicit_path.empty()) return dcf::Tokenizer::FromFile(explicit_path);
  auto tok = dcf::Tokenizer::FromModelDir(model_dir);
  if (absl::IsNotFound(tok.status())) return std::unique_ptr<dcf::Tokenizer>();
  return tok;
}

int Tokenize() {
  if (absl::GetFlag(FLAGS_tokenizer).empty()) return Fail(2, "--tokenize needs --tokenizer FILE");
  auto tok = dcf::Tokenizer::FromFile(absl::GetFlag(FLAGS_tokenizer));
  if (!tok.ok()) return Fail(1, tok.status().ToString());
  const std::string text(std::istreambuf_iterator<char>(std::cin), {});
  auto ids = (*tok)->Encode(text);
  if (!ids.ok()) return Fail(1, ids.status().ToString());
  std::cout << nlohmann::json(*ids).dump() << "\n";
  return 0;
}

// Perplexity of the text file `path` (tokenized with `tok`; "<|endoftext|>" in it is the EOS
// token). The ids are cut into consecutive windows of the model context; each window starts
// from an empty cache and every token after its first is predicted from the tokens before it
// in the window. Prints {"tokens", "predicted", "windows", "mean_nll", "perplexity"}
// (natural log); logits that are not finite fail INTERNAL (exit 1), naming the token.
// models/train/train.py computes its held-out loss the same way.
int Score(const std::string& model_dir, const std::string& path, const dcf::Tokenizer* tok) {
  if (tok == nullptr) {
    return Fail(2, absl::StrCat("--score needs a tokenizer: ", model_dir,
                                " has no tokenizer.json; give --tokenizer FILE"));
  }
  absl::StatusOr<std::string> text = dcf::ReadFileToString(path);
  if (!text.ok()) return Fail(1, absl::StrCat("--score: ", text.status().message()));
  if (const size_t bad = dcf::FirstInvalidUtf8(*text); bad < text->size()) {
    return Fail(1, absl::StrCat("--score: ", path, " is not valid UTF-8 (byte ", bad, ")"));
  }
  auto ids = tok->Encode(*text);
  if (!ids.ok()) return Fail(1, ids.status().ToString());
  if (ids->size() < 2) return Fail(1, absl::StrCat("--score: ", path, " has fewer than 2 tokens"));
  auto backend_options = dcf::BackendOptionsFromFlags();
  if (!backend_options.ok()) return Fail(2, backend_options.status().message());
  auto model = dcf::LoadModel(model_dir, *backend_options);
  if (!model.ok()) return Fail(1, model.status().ToString());
  if (absl::Status s = dcf::ValidateTokenIds("--score text", *ids, model->config.vocab_size);
      !s.ok()) {
    return Fail(1, s.message());
  }
  // A window of one token predicts nothing: there would be no perplexity to report.
  if (model->config.max_positions < 2) {
    return Fail(1, absl::StrCat("--score: the model context of ", model->config.max_positions,
                                " token cannot predict a token from the one before it (needs "
                                "a context of at least 2)"));
  }
  auto runner = dcf::SequenceRunner::Create(model->backend.get());
  if (!runner.ok()) return Fail(1, runner.status().ToString());
  const int V = model->config.vocab_size;
  const size_t window = model->config.max_positions;
  double nll = 0;
  size_t predicted = 0, windows = 0;
  std::vector<float> logits;  // [window, V] f32
  for (size_t start = 0; start + 1 < ids->size(); start += window) {
    const auto piece = absl::MakeConstSpan(*ids).subspan(start, window);
    logits.clear();
    (*runner)->Reset();
    auto st = (*runner)->Append(piece, static_cast<int>(piece.size()), &logits);
    if (!st.ok()) return Fail(1, st.ToString());
    for (size_t t = 0; t + 1 < piece.size(); ++t) {
      const float lp = dcf::ComputeLogprobs(absl::MakeConstSpan(logits).subspan(t * V, V),
                                            piece[t + 1], 0, nullptr);
      if (!std::isfinite(lp)) {  // NaN or infinite logits: no perplexity to report
        return Fail(1, absl::InternalError(absl::StrCat(
                           "--score: the model's logits are not finite (NaN or infinity) at "
                           "token ", start + t, " of ", path,
                           ": its weights may be corrupt (--check-weights scans them at load)"))
                           .ToString());
      }
      nll -= lp;
    }
    predicted += piece.size() - 1;
    ++windows;
  }
  nlohmann::ordered_json j;
  j["tokens"] = ids->size();
  j["predicted"] = predicted;
  j["windows"] = windows;
  j["mean_nll"] = nll / predicted;
  j["perplexity"] = std::exp(nll / predicted);
  std::cout << j.dump() << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> arg_storage;
  std::vector<char*> rest = dcf::ParseToolCommandLine(
      argc, argv,
      "offline greedy generation\n  dcformer-generate --model DIR (--prompt-ids 1,2,3 | "
      "--prompt TEXT) --max-new-tokens N [--json]\n  dcformer-generate --tokenizer FILE "
      "--tokenize < text\n  dcformer-generate --model DIR --score text.txt",
      arg_storage);
  if (rest.size() > 1) return Fail(2, absl::StrCat("unexpected argument '", rest[1], "'"));
  if (absl::GetFlag(FLAGS_tokenize)) return Tokenize();
  if (!absl::GetFlag(FLAGS_score).empty()) {
    const std::string model_dir = absl::GetFlag(FLAGS_model);
    auto tokenizer = LoadTokenizer(model_dir);
    if (!tokenizer.ok()) return Fail(1, tokenizer.status().ToString());
    return Score(model_dir, absl::GetFlag(FLAGS_score), tokenizer->get());
  }
  if (absl::GetFlag(FLAGS_max_new_tokens) < 1) {
    return Fail(2, "--max-new-tokens must be >= 1");
  }
  if (absl::GetFlag(FLAGS_prefill_chunk) <= 0) return Fail(2, "--prefill-chunk must be > 0");
  const bool have_ids = !absl::GetFlag(FLAGS_prompt_ids).empty();
  const bool have_text = !absl::GetFlag(FLAGS_prompt).empty();
  if (have_ids == have_text) return Fail(2, "give exactly one of --prompt-ids or --prompt");

  const std::string model_dir = absl::GetFlag(FLAGS_model);
  auto tokenizer = LoadTokenizer(model_dir);
  if (!tokenizer.ok()) return Fail(1, tokenizer.status().ToString());
  std::vector<int32_t> prompt;
  if (have_ids) {
    auto ids = dcf::ParseIdList("prompt-ids", absl::GetFlag(FLAGS_prompt_ids));
    if (!ids.ok()) return Fail(2, ids.status().message());
    prompt = std::move(*ids);
  } else {
    if (*tokenizer == nullptr) {
      return Fail(2, absl::StrCat("--prompt needs a tokenizer: ", model_dir,
                                  " has no tokenizer.json; give --tokenizer FILE"));
    }
    // The server's rule (a text prompt must be valid UTF-8), and the flag's help.
    if (const size_t bad = dcf::FirstInvalidUtf8(absl::GetFlag(FLAGS_prompt));
        bad < absl::GetFlag(FLAGS_prompt).size()) {
      return Fail(2, absl::StrCat("--prompt is not valid UTF-8 (byte ", bad, ")"));
    }
    auto ids = (*tokenizer)->Encode(absl::GetFlag(FLAGS_prompt));
    if (!ids.ok()) return Fail(1, ids.status().ToString());
    prompt = std::move(*ids);
  }

  // Check the prompt against the model before loading its weights: a tokenizer's added
  // tokens can have ids beyond the embedding table.
  auto config = dcf::ModelConfig::FromFile(model_dir + "/config.json");
  if (!config.ok()) return Fail(1, config.status().ToString());
  // The server's rule and message (engine/serving/request_validator.h): the prompt plus
  // --max-new-tokens must fit the model context; nothing is cut short silently.
  {
    dcf::GenerationRequest request;
    request.prompt_tokens = prompt;
    request.stopping.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
    request.output.text = false;
    // The engine's resolution with the server's defaults (no --max-prompt-tokens or
    // --max-new-tokens cap: the context).
    const dcf::RequestLimits limits = dcf::ResolveRequestLimits(
        config->vocab_size, config->max_positions, /*max_prompt_tokens=*/0,
        /*max_new_tokens_limit=*/0, dcf::EngineOptions().default_max_new_tokens, nullptr);
    if (absl::Status s = dcf::ValidateRequest(request, limits); !s.ok()) {
      return Fail(1, s.message());
    }
  }
  auto backend_options = dcf::BackendOptionsFromFlags();
  if (!backend_options.ok()) return Fail(2, backend_options.status().message());
  auto model = dcf::LoadModel(model_dir, *backend_options);
  if (!model.ok()) return Fail(1, model.status().ToString());
  auto runner = dcf::SequenceRunner::Create(model->backend.get());
  if (!runner.ok()) return Fail(1, runner.status().ToString());
  std::optional<int32_t> eos;
  if (*tokenizer != nullptr && !absl::GetFlag(FLAGS_ignore_eos)) eos = (*tokenizer)->eos_token_id();
  auto result = (*runner)->Greedy(prompt, absl::GetFlag(FLAGS_max_new_tokens),
                                  absl::GetFlag(FLAGS_prefill_chunk), eos);
  if (!result.ok()) return Fail(1, result.status().ToString());
  std::optional<std::string> text;
  if (*tokenizer != nullptr) {
    auto decoded = (*tokenizer)->Decode(result->tokens);
    if (!decoded.ok()) return Fail(1, decoded.status().ToString());
    text = std::move(*decoded);
  }

  if (absl::GetFlag(FLAGS_json)) {
    nlohmann::ordered_json j;
    j["tokens"] = result->tokens;
    j["logprobs"] = result->logprobs;
    const dcf::BackendInfo info = model->backend->info();
    j["backend"] = info.name;
    j["dtype"] = dcf::ComputeDTypeName(info.dtype);
    j["weights"] = dcf::WeightsName(info);
    if (text.has_value()) j["text"] = *text;
    std::cout << j.dump() << "\n";
  } else {
    std::cout << absl::StrJoin(result->tokens, ",") << "\n";
    if (text.has_value()) std::cout << *text << "\n";
  }
  return 0;
}
