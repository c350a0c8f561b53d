// What one request streams back, from what its backend sampled: appends tokens, detokenizes,
// applies the stop rules and sets the finish reason and usage of the final chunk. vLLM v1's
// output processor is the model: a pure object per request, with no model, clock or thread,
// that the engine loop drives (and SequenceRunner, for one greedy sequence), unit-tested on
// its own without a model.
//
// Process() takes any number of new tokens of the sequence at once (speculative decoding
// emits several per step) and cuts exactly at the first one that ends the request: tokens
// after it are neither emitted nor counted. The rules, checked per token in this order:
//   1. stop strings, on the detokenized text across token boundaries (stop_checker.h): the
//      text ends at the match (the stop string itself only with include_stop_string);
//   2. stop_token_ids (the token is emitted);
//   3. EOS, unless ignore_eos: the request's eos_token_id, else the engine's (the token is
//      emitted);
//   4. length: max_new_tokens generated, or the sequence's last token has no position left
//      in the model context (prompt + generated > context).
// Processing tokens one call at a time or many in one call gives the same chunks' contents
// (concatenated), the same reason and the same usage.
//
// Not thread-safe: one per request, used by one thread at a time (the engine loop).
#pragma once

#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/serving/request.h"
#include "engine/serving/stop_checker.h"
#include "engine/tokenizer/streaming_detokenizer.h"

namespace dcf {

class Tokenizer;

class OutputProcessor {
 public:
  // `tokenizer` is needed (non-null) when `output.text` or stop strings are asked for, and
  // must outlive the processor. `eos`: the EOS generation stops at when the request does not
  // name one (nullopt: none). `context`: the model's positions. Values are as
  // ValidateRequest accepted them.
  OutputProcessor(const StoppingCriteria& stopping, const OutputOptions& output,
                  std::optional<int32_t> eos, const Tokenizer* tokenizer, int prompt_len,
                  int context);

  struct Update {
    int accepted = 0;  // tokens taken, a prefix of the input; the rest are dropped
    // Why the request ends at its last accepted token; kUnspecified: it goes on. kError
    // (with `error`) when the detokenizer rejects a token.
    FinishReason reason = FinishReason::kUnspecified;
    absl::Status error;
  };

  // Appends `tokens`, in generation order, to `chunk` (tokens and text) up to and including
  // the first that ends the request. Must not be called once a reason was returned.
  Update Process(absl::Span<const TokenOutput> tokens, GenerationChunk* chunk);

  // Makes `chunk` the final one: `reason` (from Process, or kCancelled / kError decided by
  // the engine), `error` (non-OK only with kError), the text still held back (none after a
  // stop string), and usage. Timing is the caller's.
  void Finish(FinishReason reason, absl::Status error, GenerationChunk* chunk);

  // Tokens accepted so far.
  int num_generated() const { return generated_; }

 private:
  FinishReason StopAt(int32_t token) const;

  const StoppingCriteria stopping_;
  const bool text_;
  std::optional<int32_t> eos_;  // the EOS in effect (none with ignore_eos)
  const Tokenizer* tokenizer_;
  const int prompt_len_;
  const int context_;
  int generated_ = 0;
  bool stop_string_matched_ = false;
  std::unique_ptr<StreamingDetokenizer> detok_;  // when text or stop strings are asked for
  std::unique_ptr<StopStringMatcher> stop_;      // likewise
};

}  // namespace dcf
