#include "server/proto_convert.h"

#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/prompt_text.h"

namespace dcf::server {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// Copies the fields the client set; unset ones keep the engine's defaults. Values are
// validated by the engine (request_validator.h), not here.
void ConvertSampling(const v1::SamplingParams& in, SamplingParams* out) {
  if (in.has_temperature()) out->temperature = in.temperature();
  if (in.has_top_k()) out->top_k = in.top_k();
  if (in.has_top_p()) out->top_p = in.top_p();
  if (in.has_min_p()) out->min_p = in.min_p();
  if (in.has_repetition_penalty()) out->repetition_penalty = in.repetition_penalty();
  if (in.has_presence_penalty()) out->presence_penalty = in.presence_penalty();
  if (in.has_frequency_penalty()) out->frequency_penalty = in.frequency_penalty();
  if (in.has_seed()) out->seed = in.seed();
}

}  // namespace

absl::StatusOr<GenerationRequest> ToEngineRequest(const v1::GenerateRequest& request,
                                                  const RequestLimits& limits) {
  GenerationRequest out;
  out.id = request.request_id();
  out.cache_salt = request.cache_salt();
  out.speculate = !request.no_speculation();
  switch (request.prompt_case()) {
    case v1::GenerateRequest::kText: {
      absl::StatusOr<std::vector<int32_t>> ids =
          EncodeTextPrompt(request.text(), limits, "prompt.text", "send prompt.token_ids");
      if (!ids.ok()) return ids.status();
      out.prompt_tokens = *std::move(ids);
      break;
    }
    case v1::GenerateRequest::kTokenIds:
      out.prompt_tokens.assign(request.token_ids().ids().begin(), request.token_ids().ids().end());
      break;
    default:
      return Invalid("prompt", "set prompt.text or prompt.token_ids");
  }
  ConvertSampling(request.sampling(), &out.sampling);

  const v1::StoppingCriteria& stop = request.stopping();
  out.stopping.max_new_tokens =
      stop.has_max_new_tokens()
          ? stop.max_new_tokens()
          : limits.DefaultMaxNewTokens(static_cast<int>(out.prompt_tokens.size()));
  out.stopping.stop_token_ids.assign(stop.stop_token_ids().begin(), stop.stop_token_ids().end());
  out.stopping.stop_strings.assign(stop.stop_strings().begin(), stop.stop_strings().end());
  out.stopping.include_stop_string = stop.include_stop_string();
  out.stopping.ignore_eos = stop.ignore_eos();

  const v1::OutputOptions& output = request.output();
  out.output.top_logprobs = output.top_logprobs();
  out.output.logprobs = output.logprobs() || output.top_logprobs() > 0;
  // Text by default when the model has a tokenizer; asking for it without one is rejected
  // by the engine.
  out.output.text = output.has_return_text() ? output.return_text() : limits.tokenizer != nullptr;
  return out;
}

v1::FinishReason ToProtoFinishReason(FinishReason reason) {
  switch (reason) {
    case FinishReason::kEos: return v1::FINISH_REASON_EOS;
    case FinishReason::kStopToken: return v1::FINISH_REASON_STOP_TOKEN;
    case FinishReason::kStopString: return v1::FINISH_REASON_STOP_STRING;
    case FinishReason::kLength: return v1::FINISH_REASON_LENGTH;
    case FinishReason::kCancelled: return v1::FINISH_REASON_CANCELLED;
    case FinishReason::kError: return v1::FINISH_REASON_ERROR;
    case FinishReason::kUnspecified: break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

void ToProtoDuration(absl::Duration d, google::protobuf::Duration* out) {
  if (d < absl::ZeroDuration() || d == absl::InfiniteDuration()) d = absl::ZeroDuration();
  const int64_t seconds = absl::IDivDuration(d, absl::Seconds(1), &d);
  out->set_seconds(seconds);
  out->set_nanos(static_cast<int32_t>(absl::ToInt64Nanoseconds(d)));
}

void ChunkToResponse(const GenerationChunk& chunk, const std::string& request_id,
                     bool with_logprobs, v1::GenerateResponse* out) {
  out->Clear();
  out->set_request_id(request_id);
  out->mutable_token_ids()->Reserve(static_cast<int>(chunk.tokens.size()));
  for (const TokenOutput& t : chunk.tokens) {
    out->add_token_ids(t.token);
    if (with_logprobs) {
      v1::TokenLogprob* lp = out->add_logprobs();
      lp->set_token_id(t.token);
      lp->set_logprob(t.logprob);
      for (const TopLogprob& top : t.top) {
        v1::TopLogprob* alt = lp->add_top_logprobs();
        alt->set_token_id(top.token);
        alt->set_logprob(top.logprob);
      }
    }
  }
  out->set_text(chunk.text);
  if (!chunk.finished) return;
  out->set_finish_reason(ToProtoFinishReason(chunk.finish_reason));
  out->mutable_usage()->set_prompt_tokens(chunk.usage.prompt_tokens);
  out->mutable_usage()->set_generated_tokens(chunk.usage.generated_tokens);
  out->mutable_usage()->set_cached_tokens(chunk.usage.cached_tokens);
  out->mutable_usage()->set_draft_tokens(chunk.usage.draft_tokens);
  out->mutable_usage()->set_accepted_draft_tokens(chunk.usage.accepted_draft_tokens);
  ToProtoDuration(chunk.timing.queue_time, out->mutable_timing()->mutable_queue_time());
  ToProtoDuration(chunk.timing.time_to_first_token,
                  out->mutable_timing()->mutable_time_to_first_token());
  ToProtoDuration(chunk.timing.total, out->mutable_timing()->mutable_total());
  if (chunk.finish_reason == FinishReason::kError) {
    out->set_error_message(std::string(chunk.error.message()));
  }
}

}  // namespace dcf::server
