// What dcformer-loadgen sends: prompt and output lengths, random-token prompts or prompts
// from a JSONL file. Proto-free; the runner turns a PromptSpec into a GenerateRequest.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dcf::loadgen {

// An inclusive range of lengths in tokens: "128" (fixed) or "64:256" (uniform, integers).
struct LengthRange {
  int min = 1;
  int max = 1;
  bool fixed() const { return min == max; }
  std::string ToString() const;  // "128" or "64:256"
};

// Parses `text` as above; both ends >= 1 and min <= max. InvalidArgument names "--<flag>".
absl::StatusOr<LengthRange> ParseLengthRange(absl::string_view flag, absl::string_view text);

// One prompt of a JSONL prompts file.
struct FilePrompt {
  std::string text;                // the prompt when token_ids is empty
  std::vector<int32_t> token_ids;  // [prompt_len] int32
  int max_new_tokens = 0;          // 0: drawn from the run's output-length range
};

// Parses JSONL: every non-blank line is an object with exactly one of "text" (a non-empty
// string) or "token_ids" (a non-empty array of integers), and optionally "max_new_tokens"
// (an integer >= 1). Other keys are ignored. Ids are not checked against a vocabulary: an
// out-of-range id is the server's to reject (and the run counts the error). InvalidArgument
// "<name>:<line>: ..." for a bad line or a file without prompts.
absl::StatusOr<std::vector<FilePrompt>> ParsePromptsJsonl(absl::string_view name,
                                                          absl::string_view content);
// Reads and parses `path` (NotFound when it cannot be read).
absl::StatusOr<std::vector<FilePrompt>> LoadPromptsFile(const std::string& path);

// The prompt and output length of one request.
struct PromptSpec {
  std::string text;                // the prompt when token_ids is empty
  std::vector<int32_t> token_ids;  // [prompt_len] int32
  int max_new_tokens = 1;
  int prefix_group = -1;           // which shared prefix it starts with; -1: none
  int turn = 0;                    // chat workloads: 1 for a conversation's first request
};

// What random prompts look like, beyond their length.
struct RandomPromptOptions {
  LengthRange input;   // random tokens per prompt (per turn in a chat)
  LengthRange output;  // max_new_tokens
  int vocab_size = 1;  // ids uniform in [0, vocab_size)
  // Every prompt starts with one of `prefix_groups` fixed random prefixes of this many
  // tokens (chosen uniformly per prompt), then its random tokens: a system prompt or a
  // few-shot header shared by many requests.
  int shared_prefix_tokens = 0;
  int prefix_groups = 1;
  // >= 1: conversations of this many turns. Turn 1 is a prompt as above; turn k + 1 resends
  // turn k's prompt and the tokens it generated, followed by `input` new random tokens.
  int chat_turns = 0;
};

// An endless, seeded sequence of PromptSpecs. Thread-compatible (callers serialise Next and
// NextTurn).
class Workload {
 public:
  // Prompts of uniform length in `input` whose ids are uniform in [0, vocab_size)
  // (vocab_size >= 1); max_new_tokens uniform in `output`.
  static Workload RandomTokens(LengthRange input, LengthRange output, int vocab_size,
                               uint64_t seed);
  // Random prompts with shared prefixes or as conversations (see RandomPromptOptions).
  static Workload Random(const RandomPromptOptions& options, uint64_t seed);
  // `prompts` (non-empty) in file order, starting over after the last; max_new_tokens from the
  // prompt or, when it has none, uniform in `output`.
  static Workload FromFile(std::vector<FilePrompt> prompts, LengthRange output, uint64_t seed);

  // The next independent request (a chat's first turn).
  PromptSpec Next();
  // A chat's turn after `previous`, which generated `output`; nullopt after the last turn
  // (or when the workload is not a chat).
  std::optional<PromptSpec> NextTurn(const PromptSpec& previous,
                                     const std::vector<int32_t>& output);
  bool is_chat() const { return random_.chat_turns > 0; }

 private:
  Workload(RandomPromptOptions random, std::vector<FilePrompt> prompts, uint64_t seed);
  int Uniform(LengthRange range);
  void AppendRandom(int n, std::vector<int32_t>* ids);

  RandomPromptOptions random_;
  std::vector<std::vector<int32_t>> prefixes_;  // [prefix_groups][shared_prefix_tokens]
  std::vector<FilePrompt> prompts_;  // empty: random tokens
  size_t next_prompt_ = 0;
  std::mt19937_64 rng_;
};

}  // namespace dcf::loadgen
