#include "bench/loadgen/workload.h"

#include <algorithm>
#include <map>
#include <set>

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

TEST(WorkloadTest, SharedPrefixesStartEveryPrompt) {
  RandomPromptOptions o;
  o.input = {3, 3};
  o.output = {2, 2};
  o.vocab_size = 1000;
  o.shared_prefix_tokens = 20;
  o.prefix_groups = 3;
  Workload w = Workload::Random(o, 9);
  std::map<int, std::vector<int32_t>> prefix_of;
  std::set<std::vector<int32_t>> suffixes;
  for (int i = 0; i < 300; ++i) {
    const PromptSpec p = w.Next();
    ASSERT_EQ(p.token_ids.size(), 23u);
    ASSERT_GE(p.prefix_group, 0);
    ASSERT_LT(p.prefix_group, 3);
    const std::vector<int32_t> prefix(p.token_ids.begin(), p.token_ids.begin() + 20);
    auto [it, fresh] = prefix_of.emplace(p.prefix_group, prefix);
    EXPECT_EQ(it->second, prefix) << "group " << p.prefix_group << " changed its prefix";
    suffixes.insert(std::vector<int32_t>(p.token_ids.begin() + 20, p.token_ids.end()));
    EXPECT_EQ(p.turn, 0);
  }
  ASSERT_EQ(prefix_of.size(), 3u);
  EXPECT_NE(prefix_of[0], prefix_of[1]);
  EXPECT_NE(prefix_of[1], prefix_of[2]);
  EXPECT_GT(suffixes.size(), 290u);  // the suffixes are random
  // The same seed gives the same prefixes; without a chat there is no next turn.
  Workload again = Workload::Random(o, 9);
  const PromptSpec first = again.Next();
  EXPECT_EQ(std::vector<int32_t>(first.token_ids.begin(), first.token_ids.begin() + 20),
            prefix_of[first.prefix_group]);
  EXPECT_FALSE(again.NextTurn(first, {1, 2}).has_value());
}

TEST(WorkloadTest, ChatTurnsResendTheConversation) {
  RandomPromptOptions o;
  o.input = {4, 4};
  o.output = {5, 5};
  o.vocab_size = 100;
  o.shared_prefix_tokens = 6;
  o.chat_turns = 3;
  Workload w = Workload::Random(o, 2);
  ASSERT_TRUE(w.is_chat());
  PromptSpec t1 = w.Next();
  EXPECT_EQ(t1.turn, 1);
  EXPECT_EQ(t1.token_ids.size(), 10u);
  const std::vector<int32_t> out1 = {91, 92, 93, 94, 95};
  const std::optional<PromptSpec> t2 = w.NextTurn(t1, out1);
  ASSERT_TRUE(t2.has_value());
  EXPECT_EQ(t2->turn, 2);
  EXPECT_EQ(t2->prefix_group, t1.prefix_group);
  ASSERT_EQ(t2->token_ids.size(), 10u + 5u + 4u);
  EXPECT_TRUE(std::equal(t1.token_ids.begin(), t1.token_ids.end(), t2->token_ids.begin()));
  EXPECT_TRUE(std::equal(out1.begin(), out1.end(), t2->token_ids.begin() + 10));
  const std::optional<PromptSpec> t3 = w.NextTurn(*t2, {1, 2, 3, 4, 5});
  ASSERT_TRUE(t3.has_value());
  EXPECT_EQ(t3->turn, 3);
  EXPECT_EQ(t3->token_ids.size(), 19u + 5u + 4u);
  EXPECT_FALSE(w.NextTurn(*t3, {1}).has_value()) << "3 turns, not more";
  EXPECT_EQ(w.Next().turn, 1);  // a new conversation
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
