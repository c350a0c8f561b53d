#include "bench/loadgen/workload.h"

#include "gtest/gtest.h"

namespace dcf::loadgen {
namespace {

TEST(LengthRangeTest, ParsesFixedAndUniform) {
  absl::StatusOr<LengthRange> r = ParseLengthRange("input-tokens", "128");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->min, 128);
  EXPECT_EQ(r->max, 128);
  EXPECT_EQ(r->ToString(), "128");
  r = ParseLengthRange("input-tokens", "16:64");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->min, 16);
  EXPECT_EQ(r->max, 64);
  EXPECT_EQ(r->ToString(), "16:64");
}

TEST(LengthRangeTest, RejectsBadRangesNamingTheFlag) {
  for (const char* bad : {"", "x", "0", "-3", "8:4", "1:2:3", "4:", "1.5"}) {
    absl::StatusOr<LengthRange> r = ParseLengthRange("output-tokens", bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--output-tokens"), absl::string_view::npos) << bad;
  }
}

TEST(PromptsJsonlTest, ParsesTextIdsAndLengths) {
  absl::StatusOr<std::vector<FilePrompt>> p = ParsePromptsJsonl(
      "p.jsonl",
      "{\"text\": \"Hello\"}\n\n{\"token_ids\": [1, 2, 3], \"max_new_tokens\": 5, \"x\": 1}\n");
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->size(), 2u);
  EXPECT_EQ((*p)[0].text, "Hello");
  EXPECT_TRUE((*p)[0].token_ids.empty());
  EXPECT_EQ((*p)[0].max_new_tokens, 0);
  EXPECT_EQ((*p)[1].token_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ((*p)[1].max_new_tokens, 5);
}

TEST(PromptsJsonlTest, ErrorsNameFileAndLine) {
  const struct {
    const char* content;
    const char* needle;
  } cases[] = {
      {"{\"text\": \"a\"}\nnot json\n", "p.jsonl:2: not valid JSON"},
      {"[1, 2]\n", "p.jsonl:1: not a JSON object"},
      {"{\"text\": \"a\", \"token_ids\": [1]}\n", "exactly one"},
      {"{}\n", "exactly one"},
      {"{\"text\": \"\"}\n", "non-empty string"},
      {"{\"token_ids\": []}\n", "non-empty array"},
      {"{\"token_ids\": [1, 2.5]}\n", "\"token_ids\"[1]"},
      {"{\"token_ids\": [1, 3000000000]}\n", "\"token_ids\"[1]"},
      {"{\"text\": \"a\", \"max_new_tokens\": 0}\n", "max_new_tokens"},
      {"\n  \n", "no prompts"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<std::vector<FilePrompt>> p = ParsePromptsJsonl("p.jsonl", c.content);
    ASSERT_FALSE(p.ok()) << c.content;
    EXPECT_NE(p.status().message().find(c.needle), absl::string_view::npos) << p.status().message();
  }
  EXPECT_FALSE(LoadPromptsFile("/nonexistent/prompts.jsonl").ok());
}

TEST(WorkloadTest, RandomTokensStayInRangesAndFollowTheSeed) {
  Workload a = Workload::RandomTokens({4, 9}, {2, 3}, /*vocab_size=*/50, /*seed=*/3);
  Workload b = Workload::RandomTokens({4, 9}, {2, 3}, 50, 3);
  bool saw_min = false, saw_max = false;
  for (int i = 0; i < 500; ++i) {
    const PromptSpec x = a.Next();
    const PromptSpec y = b.Next();
    EXPECT_EQ(x.token_ids, y.token_ids);
    EXPECT_EQ(x.max_new_tokens, y.max_new_tokens);
    EXPECT_TRUE(x.text.empty());
    ASSERT_GE(x.token_ids.size(), 4u);
    ASSERT_LE(x.token_ids.size(), 9u);
    saw_min |= x.token_ids.size() == 4;
    saw_max |= x.token_ids.size() == 9;
    for (int32_t id : x.token_ids) {
      ASSERT_GE(id, 0);
      ASSERT_LT(id, 50);
    }
    EXPECT_GE(x.max_new_tokens, 2);
    EXPECT_LE(x.max_new_tokens, 3);
  }
  EXPECT_TRUE(saw_min && saw_max);
}

TEST(WorkloadTest, FilePromptsCycleInOrder) {
  std::vector<FilePrompt> prompts(2);
  prompts[0].text.assign(1, 'a');
  prompts[1].token_ids = {7, 8};
  prompts[1].max_new_tokens = 9;
  Workload w = Workload::FromFile(prompts, {5, 5}, 1);
  for (int round = 0; round < 3; ++round) {
    PromptSpec p = w.Next();
    EXPECT_EQ(p.text, "a");
    EXPECT_EQ(p.max_new_tokens, 5);
    p = w.Next();
    EXPECT_EQ(p.token_ids, (std::vector<int32_t>{7, 8}));
    EXPECT_EQ(p.max_new_tokens, 9);
  }
}

}  // namespace
}  // namespace dcf::loadgen
