#include "server/openai_request.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/tokenizer/tokenizer.h"
#include "gtest/gtest.h"

namespace dcf::server {
namespace {

absl::StatusOr<OpenAiRequest> Completions(absl::string_view body) {
  return ParseOpenAiRequest(OpenAiApi::kCompletions, body);
}

std::string ParamOf(absl::string_view body, OpenAiApi api = OpenAiApi::kCompletions) {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(api, body);
  EXPECT_FALSE(r.ok()) << body;
  return r.ok() ? "(ok)" : OpenAiParam(r.status());
}

TEST(OpenAiRequestTest, ParsesTheFields) {
  absl::StatusOr<OpenAiRequest> r = Completions(
      R"({"model":"m","prompt":["a",[1,2]],"max_tokens":5,"temperature":0.5,"top_p":0.9,
          "n":2,"stop":"x","seed":-1,"top_k":-1,"logprobs":3,"stream":true,
          "stream_options":{"include_usage":true},"user":"u","something_new":{"a":1}})");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->prompts.size(), 2u);
  EXPECT_TRUE(r->prompts[0].is_text);
  EXPECT_EQ(r->prompts[1].token_ids, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(*r->max_tokens, 5);
  EXPECT_FLOAT_EQ(r->sampling.temperature, 0.5f);
  EXPECT_EQ(r->n, 2);
  EXPECT_EQ(r->stop, std::vector<std::string>{"x"});
  EXPECT_EQ(*r->sampling.seed, UINT64_MAX);
  EXPECT_EQ(r->sampling.top_k, 0);
  EXPECT_TRUE(r->logprobs);
  EXPECT_EQ(r->top_logprobs, 3);
  EXPECT_TRUE(r->include_usage);
}

TEST(OpenAiRequestTest, ErrorsNameTheField) {
  EXPECT_EQ(ParamOf(R"({"model":"m","prompt":"a","temperature":"x"})"), "temperature");
  EXPECT_EQ(ParamOf(R"({"model":"m","prompt":[[1],[2,"x"]]})"), "prompt[1][1]");
  EXPECT_EQ(ParamOf(R"({"model":"m","prompt":"a","n":0})"), "n");
  EXPECT_EQ(ParamOf(R"({"model":"m","prompt":"a","tools":[{}]})"), "tools");
  EXPECT_EQ(ParamOf(R"({"model":"m","prompt":"a","response_format":{"type":"json_object"}})"),
            "response_format");
  EXPECT_EQ(ParamOf(R"({"model":"m","prompt":"a","stream_options":{}})"), "stream_options");
  EXPECT_EQ(ParamOf(R"({"model":"m","messages":[{"role":"tool","content":"x"}]})",
                    OpenAiApi::kChatCompletions),
            "messages[0].role");
  EXPECT_EQ(ParamOf(R"({"model":"m","messages":[{"role":"user","content":"\xff"}]})",
                    OpenAiApi::kChatCompletions),
            "messages[0].content");
  EXPECT_EQ(ParamOf(R"({"model":"m","prompt":[1,)"), "prompt[1]");
  EXPECT_EQ(ParamOf("[1]"), "body");
  // A number beyond a double is out_of_range, not a parse_error: refused, not thrown (the
  // fuzzer's crash: it ended the process).
  EXPECT_EQ(ParamOf(R"({"model":"m","prompt":"a","temperature":1e400})"), "temperature");
  // The error is short whatever the body: nlohmann's tag dropped, its quote of what it last
  // read and the path each clipped (an unclosed [[[... drew an answer 6x its size).
  absl::StatusOr<OpenAiRequest> bad = Completions(R"({"model":"m","prompt":"a","temperature":N})");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message().find("json.exception"), absl::string_view::npos)
      << bad.status();
  EXPECT_TRUE(absl::StartsWith(bad.status().message(),
                               "temperature: is not valid JSON (parse error at line 1"))
      << bad.status();
  for (const std::string& body :
       {R"({"model":"m","prompt":"a","x":)" + std::string(300000, '['),
        R"({"model":"m","prompt":")" + std::string(300000, 'a'),
        R"({"model":"m","prompt":"a","x":)" + std::string(3000, '[') + "\xff"}) {
    absl::StatusOr<OpenAiRequest> r = Completions(body);
    ASSERT_FALSE(r.ok());
    EXPECT_LT(r.status().message().size(), 600u) << r.status().message().substr(0, 600);
    EXPECT_LE(OpenAiParam(r.status()).size(), 203u);
  }
  // The path keeps its end, which says where.
  const std::string deep = OpenAiParam(
      Completions(R"({"model":"m","prompt":"a","x":)" + std::string(3000, '[') + "1,").status());
  EXPECT_TRUE(absl::StartsWith(deep, "...")) << deep;
  EXPECT_TRUE(absl::EndsWith(deep, "[0][1]")) << deep;
  absl::StatusOr<OpenAiRequest> huge = Completions("7638851959e436");
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument) << huge.status();
  // What OpenAI's defaults ask for passes.
  EXPECT_TRUE(Completions(R"({"model":"m","prompt":"a","tools":[],"logit_bias":{},
                              "response_format":{"type":"text"},"best_of":1})")
                  .ok());
}

TEST(OpenAiRequestTest, PlansOneEngineRequestPerChoice) {
  absl::StatusOr<OpenAiRequest> r = Completions(
      R"({"model":"m","prompt":[[1,2],[3]],"n":2,"seed":10,"max_tokens":4,"stop_token_ids":[5]})");
  ASSERT_TRUE(r.ok()) << r.status();
  RequestLimits limits;
  limits.vocab_size = 100;
  limits.context = 64;
  limits.max_prompt_tokens = 64;
  limits.max_new_tokens_limit = 64;
  absl::StatusOr<OpenAiPlan> plan = PlanOpenAiRequest(*r, limits, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->requests.size(), 4u);
  EXPECT_EQ(plan->requests[1].prompt_tokens, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(plan->requests[2].prompt_tokens, (std::vector<int32_t>{3}));
  EXPECT_EQ(*plan->requests[0].sampling.seed, 10u);
  EXPECT_EQ(*plan->requests[1].sampling.seed, 11u);
  EXPECT_EQ(plan->requests[3].stopping.max_new_tokens, 4);
  EXPECT_EQ(plan->requests[3].stopping.stop_token_ids, std::vector<int32_t>{5});
  EXPECT_EQ(plan->prompt_tokens, (std::vector<int>{2, 1}));

  // The engine's validator runs, with OpenAI's names.
  r = Completions(R"({"model":"m","prompt":[[1],[1,200]]})");
  ASSERT_TRUE(r.ok());
  plan = PlanOpenAiRequest(*r, limits, {});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(OpenAiParam(plan.status()), "prompt[1][1]") << plan.status();
  r = Completions(R"({"model":"m","prompt":[1],"max_tokens":64})");
  ASSERT_TRUE(r.ok());
  plan = PlanOpenAiRequest(*r, limits, {});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(OpenAiParam(plan.status()), "max_tokens") << plan.status();
  // A prompt that fills the context, and no max_tokens sent: the prompt is named, not the
  // max_tokens the client never set.
  r = Completions(absl::StrCat(R"({"model":"m","prompt":[[1],[)",
                               absl::StrJoin(std::vector<int>(64, 7), ","), "]]}"));
  ASSERT_TRUE(r.ok());
  plan = PlanOpenAiRequest(*r, limits, {});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(plan.status().message(),
            "prompt[1]: 64 tokens fill the model's context of 64 tokens: no room to generate");
  // Text and chat need what the model lacks here.
  r = ParseOpenAiRequest(OpenAiApi::kChatCompletions,
                         R"({"model":"m","messages":[{"role":"user","content":"hi"}]})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(OpenAiParam(PlanOpenAiRequest(*r, limits, {}).status()), "messages");
}

// cache_salt isolates the prefix cache as the gRPC field does (it was ignored, so HTTP
// tenants shared one cache namespace, and a wrong type passed): every choice carries it, the
// engine's validator bounds it, a wrong type is a 400 naming it.
TEST(OpenAiRequestTest, CacheSaltReachesEveryChoiceWithTheGrpcRules) {
  RequestLimits limits;
  limits.vocab_size = 100;
  limits.context = 64;
  limits.max_prompt_tokens = 64;
  limits.max_new_tokens_limit = 64;
  absl::StatusOr<OpenAiRequest> r =
      Completions(R"({"model":"m","prompt":[[1],[2]],"n":2,"cache_salt":"tenant-7"})");
  ASSERT_TRUE(r.ok()) << r.status();
  absl::StatusOr<OpenAiPlan> plan = PlanOpenAiRequest(*r, limits, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->requests.size(), 4u);
  for (const GenerationRequest& g : plan->requests) EXPECT_EQ(g.cache_salt, "tenant-7");
  r = Completions(R"({"model":"m","prompt":[1]})");  // unset: the shared, unsalted cache
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(PlanOpenAiRequest(*r, limits, {})->requests[0].cache_salt, "");
  EXPECT_EQ(ParamOf(R"({"model":"m","prompt":"a","cache_salt":5})"), "cache_salt");
  EXPECT_EQ(ParamOf(R"({"model":"m","messages":[{"role":"user","content":"x"}],"cache_salt":[]})",
                    OpenAiApi::kChatCompletions),
            "cache_salt");
  r = Completions(absl::StrCat(R"({"model":"m","prompt":[1],"cache_salt":")",
                               std::string(kMaxCacheSaltBytes + 1, 's'), "\"}"));
  ASSERT_TRUE(r.ok()) << r.status();
  plan = PlanOpenAiRequest(*r, limits, {});
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenAiParam(plan.status()), "cache_salt") << plan.status();
  EXPECT_TRUE(absl::StrContains(plan.status().message(), "longer than 256 bytes"))
      << plan.status();
}

// vLLM's chat fields that change the prompt were answered 200 as if absent, and a user
// message without content passed: each is refused naming the field; what asks for nothing
// passes.
TEST(OpenAiRequestTest, ChatFieldsThatChangeThePromptAreRefused) {
  const auto chat = OpenAiApi::kChatCompletions;
  const std::string head = R"({"model":"m","messages":[{"role":"user","content":"x"}],)";
  EXPECT_EQ(ParamOf(head + R"("chat_template":"{{ 1 }}"})", chat), "chat_template");
  EXPECT_EQ(ParamOf(head + R"("chat_template_kwargs":{"enable_thinking":false}})", chat),
            "chat_template_kwargs");
  EXPECT_EQ(ParamOf(head + R"("continue_final_message":true})", chat), "continue_final_message");
  EXPECT_EQ(ParamOf(head + R"("documents":[{"title":"t","text":"x"}]})", chat), "documents");
  EXPECT_EQ(ParamOf(head + R"("add_special_tokens":true})", chat), "add_special_tokens");
  EXPECT_EQ(ParamOf(head + R"("echo":true})", chat), "echo");
  EXPECT_EQ(ParamOf(head + R"("mm_processor_kwargs":{"x":1}})", chat), "mm_processor_kwargs");
  EXPECT_EQ(ParamOf(head + R"("reasoning_effort":"low"})", chat), "reasoning_effort");
  for (const char* nothing :
       {R"("chat_template":null})", R"("chat_template_kwargs":{}})",
        R"("continue_final_message":false})", R"("documents":[]})", R"("documents":null})",
        R"("add_special_tokens":false})", R"("echo":false})", R"("mm_processor_kwargs":{}})",
        R"("reasoning_effort":null})"}) {
    EXPECT_TRUE(ParseOpenAiRequest(chat, head + nothing).ok()) << nothing;
  }
  // Not chat fields on /v1/completions: unknown there, so ignored.
  EXPECT_TRUE(Completions(R"({"model":"m","prompt":"a","chat_template":"x"})").ok());
  EXPECT_EQ(ParamOf(R"({"model":"m","messages":[{"role":"user"}]})", chat), "messages[0].content");
  EXPECT_EQ(ParamOf(R"({"model":"m","messages":[{"role":"user","content":"a"},)"
                    R"({"role":"system","content":null}]})",
                    chat),
            "messages[1].content");
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(
      chat, R"({"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant"}]})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->messages[1].content, "");
}

TEST(OpenAiRequestTest, ChatRendersTheTemplate) {
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::Parse(
      "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
      "{% if add_generation_prompt %}<assistant>{% endif %}");
  ASSERT_TRUE(t.ok()) << t.status();
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(
      OpenAiApi::kChatCompletions,
      R"({"model":"m","messages":[{"role":"developer","content":"s"},
          {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]})");
  ASSERT_TRUE(r.ok()) << r.status();
  ChatTemplateContext chat;
  chat.chat_template = t->get();
  RequestLimits limits;  // no tokenizer: the rendered text cannot be encoded
  limits.vocab_size = 100;
  limits.context = 64;
  absl::StatusOr<OpenAiPlan> plan = PlanOpenAiRequest(*r, limits, chat);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(OpenAiParam(plan.status()), "messages");
  EXPECT_NE(plan.status().message().find("no tokenizer"), std::string::npos);
}

}  // namespace
}  // namespace dcf::server
