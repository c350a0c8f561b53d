#include "server/proto_convert.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/backends/backend_factory.h"
#include "engine/common/status_macros.h"
#include "engine/tokenizer/tokenizer.h"

namespace dcf::server {
namespace {

constexpr int kMaxRequestIdLength = 128;
constexpr int kMaxStopStrings = 16;
constexpr int kMaxStopStringBytes = 256;
constexpr int kMaxStopTokenIds = 64;

absl::Status Invalid(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

absl::Status CheckTokenId(absl::string_view field, int index, int32_t id, int32_t vocab) {
  if (id < 0 || id >= vocab) {
    return absl::InvalidArgumentError(absl::StrCat(field, "[", index, "]: token id ", id,
                                                   " is outside the vocabulary [0, ", vocab,
                                                   ")"));
  }
  return absl::OkStatus();
}

absl::Status ConvertSampling(const v1::SamplingParams& in, SamplingParams* out) {
  if (in.has_temperature()) {
    if (!std::isfinite(in.temperature()) || in.temperature() < 0) {
      return Invalid("sampling.temperature", "must be finite and >= 0");
    }
    out->temperature = in.temperature();
  }
  if (in.has_top_k()) {
    if (in.top_k() < 0) return Invalid("sampling.top_k", "must be >= 0 (0 = off)");
    out->top_k = in.top_k();
  }
  if (in.has_top_p()) {
    if (!(in.top_p() > 0.0f && in.top_p() <= 1.0f)) {
      return Invalid("sampling.top_p", "must be in (0, 1]");
    }
    out->top_p = in.top_p();
  }
  if (in.has_min_p()) {
    if (!(in.min_p() >= 0.0f && in.min_p() <= 1.0f)) {
      return Invalid("sampling.min_p", "must be in [0, 1]");
    }
    out->min_p = in.min_p();
  }
  if (in.has_repetition_penalty()) {
    if (!std::isfinite(in.repetition_penalty()) || in.repetition_penalty() <= 0) {
      return Invalid("sampling.repetition_penalty", "must be finite and > 0");
    }
    out->repetition_penalty = in.repetition_penalty();
  }
  if (in.has_presence_penalty()) {
    if (!(in.presence_penalty() >= -2.0f && in.presence_penalty() <= 2.0f)) {
      return Invalid("sampling.presence_penalty", "must be in [-2, 2]");
    }
    out->presence_penalty = in.presence_penalty();
  }
  if (in.has_frequency_penalty()) {
    if (!(in.frequency_penalty() >= -2.0f && in.frequency_penalty() <= 2.0f)) {
      return Invalid("sampling.frequency_penalty", "must be in [-2, 2]");
    }
    out->frequency_penalty = in.frequency_penalty();
  }
  if (in.has_seed()) out->seed = in.seed();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GenerationRequest> ToEngineRequest(const v1::GenerateRequest& request,
                                                  const RequestLimits& limits) {
  GenerationRequest out;
  if (request.request_id().size() > kMaxRequestIdLength) {
    return Invalid("request_id", absl::StrCat("longer than ", kMaxRequestIdLength, " bytes"));
  }
  for (char c : request.request_id()) {
    if (c < 0x21 || c > 0x7e) return Invalid("request_id", "must be printable ASCII");
  }
  out.id = request.request_id();

  switch (request.prompt_case()) {
    case v1::GenerateRequest::kText: {
      if (request.text().empty()) return Invalid("prompt.text", "is empty");
      if (limits.tokenizer == nullptr) {
        return Invalid("prompt.text", "this model has no tokenizer; send prompt.token_ids");
      }
      ASSIGN_OR_RETURN(out.prompt_tokens, limits.tokenizer->Encode(request.text()));
      if (out.prompt_tokens.empty()) return Invalid("prompt.text", "encodes to no tokens");
      break;
    }
    case v1::GenerateRequest::kTokenIds: {
      const auto& ids = request.token_ids().ids();
      if (ids.empty()) return Invalid("prompt.token_ids", "is empty");
      for (int i = 0; i < ids.size(); ++i) {
        RETURN_IF_ERROR(CheckTokenId("prompt.token_ids.ids", i, ids[i], limits.vocab_size));
      }
      out.prompt_tokens.assign(ids.begin(), ids.end());
      break;
    }
    default:
      return Invalid("prompt", "set prompt.text or prompt.token_ids");
  }

  RETURN_IF_ERROR(ConvertSampling(request.sampling(), &out.sampling));

  const v1::StoppingCriteria& stop = request.stopping();
  if (stop.has_max_new_tokens()) {
    if (stop.max_new_tokens() < 1) return Invalid("stopping.max_new_tokens", "must be >= 1");
    out.stopping.max_new_tokens = stop.max_new_tokens();
  } else {
    // Unset: the server default, shortened to the server's max_new_tokens limit and to the
    // context left after the prompt.
    const int room = limits.context_length - static_cast<int>(out.prompt_tokens.size());
    int max_new = std::min(limits.default_max_new_tokens, room);
    if (limits.max_new_tokens_limit > 0) max_new = std::min(max_new, limits.max_new_tokens_limit);
    out.stopping.max_new_tokens = std::max(1, max_new);
  }
  if (stop.stop_token_ids_size() > kMaxStopTokenIds) {
    return Invalid("stopping.stop_token_ids", absl::StrCat("more than ", kMaxStopTokenIds));
  }
  for (int i = 0; i < stop.stop_token_ids_size(); ++i) {
    RETURN_IF_ERROR(CheckTokenId("stopping.stop_token_ids", i, stop.stop_token_ids(i),
                                 limits.vocab_size));
    out.stopping.stop_token_ids.push_back(stop.stop_token_ids(i));
  }
  if (stop.stop_strings_size() > 0 && limits.tokenizer == nullptr) {
    return Invalid("stopping.stop_strings", "this model has no tokenizer");
  }
  if (stop.stop_strings_size() > kMaxStopStrings) {
    return Invalid("stopping.stop_strings", absl::StrCat("more than ", kMaxStopStrings));
  }
  for (int i = 0; i < stop.stop_strings_size(); ++i) {
    const std::string& s = stop.stop_strings(i);
    if (s.empty() || s.size() > kMaxStopStringBytes) {
      return Invalid(absl::StrCat("stopping.stop_strings[", i, "]"),
                     absl::StrCat("must be 1 to ", kMaxStopStringBytes, " bytes"));
    }
    out.stopping.stop_strings.push_back(s);
  }
  out.stopping.include_stop_string = stop.include_stop_string();
  out.stopping.ignore_eos = stop.ignore_eos();

  const v1::OutputOptions& output = request.output();
  if (output.top_logprobs() < 0 || output.top_logprobs() > kMaxTopLogprobs) {
    return Invalid("output.top_logprobs", absl::StrCat("must be in [0, ", kMaxTopLogprobs, "]"));
  }
  out.output.top_logprobs = output.top_logprobs();
  out.output.logprobs = output.logprobs() || output.top_logprobs() > 0;
  if (output.has_return_text()) {
    if (output.return_text() && limits.tokenizer == nullptr) {
      return Invalid("output.return_text", "this model has no tokenizer");
    }
    out.output.text = output.return_text();
  } else {
    out.output.text = limits.tokenizer != nullptr;
  }
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

const char* FinishReasonLabel(FinishReason reason) {
  switch (reason) {
    case FinishReason::kEos: return "eos";
    case FinishReason::kStopToken: return "stop_token";
    case FinishReason::kStopString: return "stop_string";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
    case FinishReason::kUnspecified: break;
  }
  return "unspecified";
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
  ToProtoDuration(chunk.timing.queue_time, out->mutable_timing()->mutable_queue_time());
  ToProtoDuration(chunk.timing.time_to_first_token,
                  out->mutable_timing()->mutable_time_to_first_token());
  ToProtoDuration(chunk.timing.total, out->mutable_timing()->mutable_total());
  if (chunk.finish_reason == FinishReason::kError) {
    out->set_error_message(std::string(chunk.error.message()));
  }
}

void ToProtoModelInfo(const ModelConfig& config, const ServedModelInfo& info,
                      v1::GetModelInfoResponse* out) {
  out->Clear();
  out->set_model_name(info.model_name);
  out->set_architecture(config.architecture == Architecture::kDcPythia ? "dcpythia" : "dcformer");
  out->set_num_layers(config.n_layer);
  out->set_num_heads(config.n_head);
  out->set_head_dim(config.head_dim);
  out->set_hidden_size(config.dim);
  out->set_context_length(config.max_positions);
  out->set_vocab_size(config.vocab_size);
  if (info.eos_token_id.has_value()) out->add_eos_token_ids(*info.eos_token_id);
  out->set_block_size(info.block_size);
  out->set_backend(info.backend.name);
  out->set_dtype(ComputeDTypeName(info.backend.dtype));
  out->set_device(info.backend.device);
  out->set_kv_cache_bytes(static_cast<int64_t>(info.kv_cache_bytes));
  for (LayerGroup group : {LayerGroup::kGlobal, LayerGroup::kWindow}) {
    if (config.NumLayersIn(group) == 0) continue;
    v1::LayerGroup* g = out->add_layer_groups();
    g->set_name(group == LayerGroup::kGlobal ? "global" : "window");
    g->set_window(group == LayerGroup::kGlobal ? 0 : config.window_size);
    for (int l = 0; l < config.n_layer; ++l) {
      if (config.GroupOf(l) == group) g->add_layers(l);
    }
    g->set_kv_blocks_total(info.kv_blocks_total[static_cast<int>(group)]);
  }
  out->set_has_tokenizer(info.has_tokenizer);
  out->set_max_prompt_tokens(info.max_prompt_tokens);
  out->set_max_new_tokens(info.max_new_tokens);
  out->set_default_max_new_tokens(info.default_max_new_tokens);
}

}  // namespace dcf::server
