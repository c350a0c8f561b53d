#include "server/proto_convert.h"

#include "absl/strings/str_cat.h"
#include "engine/common/status_macros.h"
#include "engine/serving/request_validator.h"
#include "gtest/gtest.h"
#include "server/model_info.h"

// GCC 12 reports a false -Wrestrict inside std::string when protobuf setters are inlined.
#pragma GCC diagnostic ignored "-Wrestrict"

namespace dcf::server {
namespace {

// Limits as Engine::limits() resolves them for a 256-position model without a tokenizer.
RequestLimits Limits() {
  RequestLimits l;
  l.vocab_size = 300;
  l.context = 256;
  l.max_prompt_tokens = 256;
  l.max_new_tokens_limit = 256;
  l.default_max_new_tokens = 100;
  return l;
}

v1::GenerateRequest IdsRequest(std::vector<int32_t> ids) {
  v1::GenerateRequest r;
  r.mutable_token_ids()->mutable_ids()->Add(ids.begin(), ids.end());
  return r;
}

TEST(ToEngineRequestTest, UnsetFieldsTakeDefaultsAndZeroIsExplicit) {
  v1::GenerateRequest r = IdsRequest({1, 2, 3});
  auto out = ToEngineRequest(r, Limits());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->prompt_tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(out->sampling.temperature, 1.0f);
  EXPECT_FALSE(out->sampling.seed.has_value());
  EXPECT_EQ(out->stopping.max_new_tokens, 100);
  EXPECT_FALSE(out->output.text);  // no tokenizer
  EXPECT_FALSE(out->output.logprobs);

  r.mutable_sampling()->set_temperature(0);
  r.mutable_sampling()->set_seed(0);
  r.mutable_stopping()->set_max_new_tokens(7);
  r.mutable_output()->set_top_logprobs(3);
  r.set_request_id("abc-1");
  r.set_cache_salt("tenant-7");
  out = ToEngineRequest(r, Limits());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->sampling.temperature, 0.0f);
  EXPECT_EQ(out->sampling.seed, std::optional<uint64_t>(0));
  EXPECT_EQ(out->stopping.max_new_tokens, 7);
  EXPECT_TRUE(out->output.logprobs);  // implied by top_logprobs
  EXPECT_EQ(out->output.top_logprobs, 3);
  EXPECT_EQ(out->id, "abc-1");
  EXPECT_EQ(out->cache_salt, "tenant-7");
}

TEST(ToEngineRequestTest, DefaultMaxNewTokensFitsTheContext) {
  auto out = ToEngineRequest(IdsRequest(std::vector<int32_t>(250, 5)), Limits());
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->stopping.max_new_tokens, 6);
}

TEST(ToEngineRequestTest, DefaultMaxNewTokensFitsTheServerLimit) {
  RequestLimits limits = Limits();
  limits.max_new_tokens_limit = 40;  // below the default (100) and the room (253)
  auto out = ToEngineRequest(IdsRequest({1, 2, 3}), limits);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->stopping.max_new_tokens, 40);

  // The smaller of the limit and the room wins.
  out = ToEngineRequest(IdsRequest(std::vector<int32_t>(250, 5)), limits);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->stopping.max_new_tokens, 6);

  // A limit above the default leaves the default alone.
  limits.max_new_tokens_limit = 200;
  out = ToEngineRequest(IdsRequest({1, 2, 3}), limits);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->stopping.max_new_tokens, 100);

  // An explicit max_new_tokens is not clipped here: the engine rejects it (OUT_OF_RANGE).
  limits.max_new_tokens_limit = 40;
  v1::GenerateRequest r = IdsRequest({1, 2, 3});
  r.mutable_stopping()->set_max_new_tokens(50);
  out = ToEngineRequest(r, limits);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->stopping.max_new_tokens, 50);
}

// The server only converts; the engine's one validator judges the values. Every rejection
// of a converted request names the field.
absl::Status ConvertAndValidate(const v1::GenerateRequest& request) {
  ASSIGN_OR_RETURN(GenerationRequest converted, ToEngineRequest(request, Limits()));
  return ValidateRequest(converted, Limits());
}

TEST(ToEngineRequestTest, ErrorsNameTheField) {
  struct Case {
    const char* field;
    void (*mutate)(v1::GenerateRequest&);
  };
  const Case cases[] = {
      {"prompt", [](v1::GenerateRequest& r) { r.clear_prompt(); }},
      {"prompt_tokens", [](v1::GenerateRequest& r) { r.mutable_token_ids()->clear_ids(); }},
      {"prompt_tokens[1]", [](v1::GenerateRequest& r) { r.mutable_token_ids()->set_ids(1, 300); }},
      {"prompt.text", [](v1::GenerateRequest& r) { r.set_text("hello"); }},
      {"sampling.temperature",
       [](v1::GenerateRequest& r) { r.mutable_sampling()->set_temperature(-0.5f); }},
      {"sampling.top_k", [](v1::GenerateRequest& r) { r.mutable_sampling()->set_top_k(-1); }},
      {"sampling.top_p", [](v1::GenerateRequest& r) { r.mutable_sampling()->set_top_p(0); }},
      {"sampling.min_p", [](v1::GenerateRequest& r) { r.mutable_sampling()->set_min_p(1.5f); }},
      {"sampling.repetition_penalty",
       [](v1::GenerateRequest& r) { r.mutable_sampling()->set_repetition_penalty(0); }},
      {"sampling.presence_penalty",
       [](v1::GenerateRequest& r) { r.mutable_sampling()->set_presence_penalty(2.5f); }},
      {"sampling.frequency_penalty",
       [](v1::GenerateRequest& r) { r.mutable_sampling()->set_frequency_penalty(-3); }},
      {"stopping.max_new_tokens",
       [](v1::GenerateRequest& r) { r.mutable_stopping()->set_max_new_tokens(0); }},
      {"stopping.stop_token_ids[0]",
       [](v1::GenerateRequest& r) { r.mutable_stopping()->add_stop_token_ids(-4); }},
      {"stopping.stop_strings",
       [](v1::GenerateRequest& r) { r.mutable_stopping()->add_stop_strings("x"); }},
      {"output.top_logprobs",
       [](v1::GenerateRequest& r) { r.mutable_output()->set_top_logprobs(21); }},
      {"output.text", [](v1::GenerateRequest& r) { r.mutable_output()->set_return_text(true); }},
      // The proto's field name (issue 24), though the engine's GenerationRequest calls it id.
      {"request_id", [](v1::GenerateRequest& r) { r.set_request_id("has space"); }},
      {"request_id", [](v1::GenerateRequest& r) { r.set_request_id(std::string(129, 'x')); }},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest r = IdsRequest({1, 2});
    c.mutate(r);
    const absl::Status st = ConvertAndValidate(r);
    ASSERT_FALSE(st.ok()) << c.field;
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_EQ(std::string(st.message()).rfind(absl::StrCat(c.field, ":"), 0), 0u) << st;
  }
}

TEST(ChunkToResponseTest, TokensLogprobsAndFinalFields) {
  GenerationChunk chunk;
  chunk.tokens = {{7, -0.5f, {{7, -0.5f}, {9, -1.5f}}}, {8, -0.25f, {}}};
  chunk.text = "ab";
  v1::GenerateResponse out;
  ChunkToResponse(chunk, "id-1", /*with_logprobs=*/true, &out);
  EXPECT_EQ(out.request_id(), "id-1");
  ASSERT_EQ(out.token_ids_size(), 2);
  EXPECT_EQ(out.token_ids(1), 8);
  ASSERT_EQ(out.logprobs_size(), 2);
  EXPECT_EQ(out.logprobs(0).top_logprobs_size(), 2);
  EXPECT_EQ(out.logprobs(0).top_logprobs(1).token_id(), 9);
  EXPECT_EQ(out.finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
  EXPECT_FALSE(out.has_usage());

  chunk.finished = true;
  chunk.finish_reason = FinishReason::kStopToken;
  chunk.usage = {5, 2, 4};
  chunk.timing.queue_time = absl::Microseconds(1500);
  chunk.timing.time_to_first_token = absl::Milliseconds(20);
  chunk.timing.total = absl::Seconds(2) + absl::Nanoseconds(5);
  ChunkToResponse(chunk, "id-1", /*with_logprobs=*/false, &out);
  EXPECT_EQ(out.logprobs_size(), 0);
  EXPECT_EQ(out.finish_reason(), v1::FINISH_REASON_STOP_TOKEN);
  EXPECT_EQ(out.usage().prompt_tokens(), 5);
  EXPECT_EQ(out.usage().generated_tokens(), 2);
  EXPECT_EQ(out.usage().cached_tokens(), 4);
  EXPECT_EQ(out.timing().queue_time().nanos(), 1'500'000);
  EXPECT_EQ(out.timing().total().seconds(), 2);
  EXPECT_EQ(out.timing().total().nanos(), 5);
}

TEST(FinishReasonTest, EveryReasonMaps) {
  EXPECT_EQ(ToProtoFinishReason(FinishReason::kEos), v1::FINISH_REASON_EOS);
  EXPECT_EQ(ToProtoFinishReason(FinishReason::kStopString), v1::FINISH_REASON_STOP_STRING);
  EXPECT_EQ(ToProtoFinishReason(FinishReason::kLength), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(ToProtoFinishReason(FinishReason::kCancelled), v1::FINISH_REASON_CANCELLED);
  EXPECT_EQ(ToProtoFinishReason(FinishReason::kError), v1::FINISH_REASON_ERROR);
}

TEST(ModelInfoTest, LayerGroupsAndLimits) {
  ModelConfig config;
  config.n_layer = 4;
  config.n_head = 8;
  config.head_dim = 16;
  config.dim = 128;
  config.vocab_size = 300;
  config.max_positions = 256;
  config.window_size = 16;
  config.window_pattern = WindowPattern::kLG;
  config.torch_dtype = "float32";
  ServedModelInfo info;
  info.model_name = "tiny";
  info.backend = {"cuda", "NVIDIA H200", DType::kBF16};
  info.kv_cache_bytes = 123456789;
  info.block_size = 16;
  info.limits = Limits();
  info.limits.eos_token_id = 2;
  info.limits.max_new_tokens_limit = 40;
  info.kv_blocks_total = {10, 20};
  v1::GetModelInfoResponse out;
  ToProtoModelInfo(config, info, &out);
  EXPECT_EQ(out.context_length(), 256);
  EXPECT_EQ(out.backend(), "cuda");
  EXPECT_EQ(out.device(), "NVIDIA H200");
  EXPECT_EQ(out.dtype(), "bfloat16");
  EXPECT_EQ(out.kv_cache_bytes(), 123456789);
  ASSERT_EQ(out.eos_token_ids_size(), 1);
  EXPECT_EQ(out.eos_token_ids(0), 2);
  EXPECT_FALSE(out.has_tokenizer());
  EXPECT_EQ(out.max_prompt_tokens(), 256);
  EXPECT_EQ(out.max_new_tokens(), 40);
  EXPECT_EQ(out.default_max_new_tokens(), 100);
  EXPECT_FALSE(out.prefix_caching());
  info.prefix_caching = true;
  ToProtoModelInfo(config, info, &out);
  EXPECT_TRUE(out.prefix_caching());
  // No EOS resolved (a model without a tokenizer): none is reported, whatever config.json
  // says (the engine would never stop at it).
  info.limits.eos_token_id.reset();
  config.eos_token_id = 2;
  ToProtoModelInfo(config, info, &out);
  EXPECT_EQ(out.eos_token_ids_size(), 0);
  ASSERT_EQ(out.layer_groups_size(), 2);
  EXPECT_EQ(out.layer_groups(0).name(), "global");
  EXPECT_EQ(out.layer_groups(0).window(), 0);
  EXPECT_EQ(out.layer_groups(0).kv_blocks_total(), 10);
  EXPECT_EQ(out.layer_groups(1).name(), "window");
  EXPECT_EQ(out.layer_groups(1).window(), 16);
  EXPECT_EQ(out.layer_groups(1).layers_size() + out.layer_groups(0).layers_size(), 4);
}

}  // namespace
}  // namespace dcf::server
