#include "server/chat_template.h"

#include <pthread.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <set>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gtest/gtest.h"
#include "server/jinja_builtins.h"
#include "server/jinja_parser.h"

namespace dcf::server {
namespace {

std::string Render(const std::string& source, const ChatTemplateInputs& inputs) {
  auto t = ChatTemplate::Parse(source);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return "<parse error>";
  auto out = (*t)->Render(inputs);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : "<render error>";
}

ChatTemplateInputs Conversation() {
  ChatTemplateInputs in;
  in.messages = {{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Why?"}};
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  return in;
}

// ChatML as Qwen and many others carry it, verbatim from their tokenizer_config.json; the
// expected text is what transformers' apply_chat_template (jinja2, trim_blocks and
// lstrip_blocks) renders for the same messages.
TEST(ChatTemplateTest, ChatMl) {
  const std::string chatml =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|im_start|>assistant\\n' }}{% endif %}";
  EXPECT_EQ(Render(chatml, Conversation()),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n"
            "<|im_start|>assistant\n");
  ChatTemplateInputs no_prompt = Conversation();
  no_prompt.add_generation_prompt = false;
  EXPECT_FALSE(absl::EndsWith(Render(chatml, no_prompt), "assistant\n"));
}

// Zephyr's template: trim_blocks/lstrip_blocks, elif chains, eos_token, loop.last.
TEST(ChatTemplateTest, ZephyrWithBlockWhitespaceRules) {
  const std::string zephyr =
      "{% for message in messages %}\n"
      "{% if message['role'] == 'user' %}\n"
      "{{ '<|user|>\\n' + message['content'] + eos_token }}\n"
      "{% elif message['role'] == 'system' %}\n"
      "{{ '<|system|>\\n' + message['content'] + eos_token }}\n"
      "{% elif message['role'] == 'assistant' %}\n"
      "{{ '<|assistant|>\\n'  + message['content'] + eos_token }}\n"
      "{% endif %}\n"
      "{% if loop.last and add_generation_prompt %}\n"
      "{{ '<|assistant|>' }}\n"
      "{% endif %}\n"
      "{% endfor %}";
  EXPECT_EQ(Render(zephyr, Conversation()),
            "<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\nHello.</s>\n"
            "<|user|>\nWhy?</s>\n<|assistant|>\n");
}

// Llama-2's: slicing, namespace-free system handling, raise_exception, modulo, strip().
TEST(ChatTemplateTest, LlamaTwoAndItsRefusal) {
  const std::string llama2 =
      "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
      "{% set system_message = messages[0]['content'] %}{% else %}"
      "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
      "{% for message in loop_messages %}"
      "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
      "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
      "{% endif %}"
      "{% if loop.index0 == 0 and system_message != false %}"
      "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
      "{% else %}{% set content = message['content'] %}{% endif %}"
      "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
      "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
      "{% endif %}{% endfor %}";
  EXPECT_EQ(Render(llama2, Conversation()),
            "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello. </s><s>[INST] Why? [/INST]");
  auto t = ChatTemplate::Parse(llama2);
  ASSERT_TRUE(t.ok());
  ChatTemplateInputs bad;
  bad.messages = {{"user", "a"}, {"user", "b"}};
  auto refused = (*t)->Render(bad);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "roles must alternate"))
      << refused.status();
}

TEST(ChatTemplateTest, NamespacesFiltersTestsAndExpressions) {
  const std::string source =
      "{%- set ns = namespace(count=0, last='') -%}"
      "{%- for m in messages -%}{%- set ns.count = ns.count + 1 -%}"
      "{%- if m.role is defined and m.missing is not defined -%}{%- set ns.last = m.role -%}"
      "{%- endif -%}{%- endfor -%}"
      "{{ ns.count }}|{{ ns.last | upper }}|{{ messages | length }}|{{ (messages | last).content }}"
      "|{{ 'yes' if 'Hi' in messages[1].content else 'no' }}|{{ [1, 2, 3] | join('-') }}"
      "|{{ 7 // 2 }}{{ 7 % 3 }}{{ -2 + 5 * 2 }}|{{ {'a': 1} | tojson }}|{{ undefined_name }}"
      "|{{ missing | default('dflt') }}|{{ '  x  ' | trim }}|{{ 'ab' ~ 1 }}|{{ range(3) | list }}"
      "|{% for k, v in {'k': 'v'}.items() %}{{ k }}={{ v }}{% endfor %}"
      "|{{ messages[-1]['role'] }}|{{ 'abc'[::-1] }}|{{ none is none }}";
  EXPECT_EQ(Render(source, Conversation()),
            "4|USER|4|Why?|yes|1-2-3|318|{\"a\":1}||dflt|x|ab1|[0, 1, 2]|k=v|user|cba|True");
}

TEST(ChatTemplateTest, RefusesWhatItDoesNotSupportAtParseTimeWithThePlace) {
  struct Case {
    const char* source;
    const char* error;
  } cases[] = {
      {"{% macro f() %}x{% endmacro %}", "line 1, column 1: the tag 'macro' is not supported"},
      {"a\n  {{ x | wordwrap }}", "line 2, column 10: the filter 'wordwrap' is not supported"},
      // Positions inside a tag: after its '-' or '+', and on its later lines.
      {"{{- x | wordwrap }}", "line 1, column 9: the filter 'wordwrap'"},
      {"{%+ if x is divisibleby(3) %}{% endif %}", "line 1, column 10: the test 'divisibleby'"},
      {"{{ x\n   | wordwrap }}", "line 2, column 6: the filter 'wordwrap'"},
      {"{{ 'a\nb' ~\n\n  'c' | wordwrap }}", "line 4, column 9: the filter 'wordwrap'"},
      {"x\n{%- if\n  y @ z %}{% endif %}", "line 3, column 5: unexpected character '@'"},
      {"{% if x is divisibleby(3) %}{% endif %}", "the test 'divisibleby' is not supported"},
      {"{% for x in y %}", "ends before its 'endfor'"},
      {"{{ x ", "'{{' is never closed"},
      {"{% endif %}", "'endif' without its opening tag"},
      {"{% include 'other' %}", "the tag 'include' is not supported"},
      {"{{ 'unterminated }}", "a string is never closed"},
      {"{% for x in y if x %}{% endfor %}", "loop filters"},
      {"{% set x %}y{% endset %}", "no set blocks"},
  };
  for (const Case& c : cases) {
    auto t = ChatTemplate::Parse(c.source);
    ASSERT_FALSE(t.ok()) << c.source;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StrContains(t.status().message(), c.error))
        << c.source << ": " << t.status().message();
  }
}

// The parser accepts a filter or test exactly when the renderer can run it: both ask the one
// table of jinja_builtins.h. Every name the tables hold (aliases included) is accepted at load
// and renders what that filter or test does; a name they do not hold is refused at load with
// its place. A filter or test added to a table needs its line here, or the name sets differ.
TEST(ChatTemplateTest, EveryBuiltinFilterAndTestIsAcceptedAtLoadAndRuns) {
  struct FilterCase {
    const char* name;
    const char* subject;
    const char* args;  // appended after the name
    const char* expected;
  } filters[] = {
      {"trim", "' Ab c '", "", "Ab c"},
      {"length", "[1, 2]", "", "2"},
      {"count", "'abc'", "", "3"},
      {"upper", "'Ab c'", "", "AB C"},
      {"lower", "'Ab c'", "", "ab c"},
      {"capitalize", "'aB c'", "", "Ab c"},
      {"title", "'ab c'", "", "Ab C"},
      {"default", "undefined_name", "('x')", "x"},
      {"d", "''", "('y', true)", "y"},
      {"tojson", "{'a': [1, none]}", "", "{\"a\":[1,null]}"},
      {"string", "[1, 'a']", "", "[1, 'a']"},
      {"int", "'42'", "", "42"},
      {"join", "[1, 2]", "('-')", "1-2"},
      {"first", "[3, 4]", "", "3"},
      {"last", "[3, 4]", "", "4"},
      {"list", "'ab'", "", "['a', 'b']"},
      {"reverse", "[1, 2]", "", "[2, 1]"},
      {"replace", "'a-b'", "('-', '+')", "a+b"},
      {"items", "{'k': 'v'}", "", "[['k', 'v']]"},
  };
  std::set<std::string> filter_names;
  for (const FilterCase& c : filters) {
    filter_names.insert(c.name);
    const std::string source = std::string("{{ ") + c.subject + " | " + c.name + c.args + " }}";
    EXPECT_EQ(Render(source, Conversation()), c.expected) << source;
  }
  std::set<std::string> table_filters;
  for (const auto& [name, fn] : jinja::Filters()) table_filters.insert(name);
  EXPECT_EQ(filter_names, table_filters);

  struct TestCase {
    const char* name;
    const char* passes;  // `passes is name` is true
    const char* fails;   // `fails is name` is false
  } tests[] = {
      {"defined", "1", "undefined_name"},
      {"undefined", "undefined_name", "1"},
      {"none", "none", "0"},
      {"string", "'s'", "1"},
      {"number", "1.5", "'1'"},
      {"integer", "1", "1.5"},
      {"float", "1.5", "1"},
      {"boolean", "false", "0"},
      {"mapping", "{}", "[]"},
      {"sequence", "[]", "1"},
      {"iterable", "'s'", "none"},
      {"true", "true", "1"},
      {"false", "false", "0"},
      {"odd", "3", "4"},
      {"even", "4", "3"},
  };
  std::set<std::string> test_names;
  for (const TestCase& c : tests) {
    test_names.insert(c.name);
    const std::string source = std::string("{{ ") + c.passes + " is " + c.name + " }} {{ " +
                               c.fails + " is " + c.name + " }} {{ " + c.passes + " is not " +
                               c.name + " }}";
    EXPECT_EQ(Render(source, Conversation()), "True False False") << source;
  }
  std::set<std::string> table_tests;
  for (const auto& [name, fn] : jinja::Tests()) table_tests.insert(name);
  EXPECT_EQ(test_names, table_tests);

  EXPECT_EQ(jinja::Filters().count("wordwrap"), 0u);
  EXPECT_EQ(jinja::Tests().count("divisibleby"), 0u);
  auto filter = ChatTemplate::Parse("{{ 'x' | wordwrap }}");
  EXPECT_EQ(filter.status().message(),
            "chat template line 1, column 10: the filter 'wordwrap' is not supported");
  auto test = ChatTemplate::Parse("{% if 3 is divisibleby(3) %}{% endif %}");
  EXPECT_EQ(test.status().message(),
            "chat template line 1, column 9: the test 'divisibleby' is not supported");
}

// The names chat_template.h's comment lists for users ("filters: ...;", "tests: ...;") are
// the tables' names, so the list cannot drift from what the interpreter accepts.
std::set<std::string> ListedNames(const std::string& header, const std::string& label) {
  const size_t start = header.find("//   - " + label + ": ");
  EXPECT_NE(start, std::string::npos) << label;
  if (start == std::string::npos) return {};
  const size_t end = header.find(';', start);
  std::string list = header.substr(start + label.size() + 9, end - start - label.size() - 9);
  std::set<std::string> names;
  for (absl::string_view line : absl::StrSplit(list, '\n')) {
    absl::ConsumePrefix(&line, "//");
    for (absl::string_view name : absl::StrSplit(line, absl::ByAnyChar(",/"))) {
      name = absl::StripAsciiWhitespace(name);
      if (!name.empty()) names.insert(std::string(name));
    }
  }
  return names;
}

TEST(ChatTemplateTest, TheHeaderListsExactlyTheTablesNames) {
  std::ifstream in(std::string(DCF_SOURCE_DIR) + "/server/chat_template.h");
  ASSERT_TRUE(in.good());
  const std::string header((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::set<std::string> filters, tests;
  for (const auto& [name, fn] : jinja::Filters()) filters.insert(name);
  for (const auto& [name, fn] : jinja::Tests()) tests.insert(name);
  EXPECT_EQ(ListedNames(header, "filters"), filters);
  EXPECT_EQ(ListedNames(header, "tests"), tests);
}

TEST(ChatTemplateTest, RenderErrorsNameTheirPlace) {
  auto t = ChatTemplate::Parse("ok\n{{ nothing.attr }}");
  ASSERT_TRUE(t.ok());
  auto out = (*t)->Render(Conversation());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(out.status().message(), "line 2")) << out.status();
  // An unknown dict method is an error whatever the dict holds (an empty one gave []).
  for (const char* source : {"{{ {}.pop() }}", "{{ {'a': 1}.pop() }}"}) {
    auto d = ChatTemplate::Parse(source);
    ASSERT_TRUE(d.ok()) << source;
    const absl::Status st = (*d)->Render(Conversation()).status();
    EXPECT_TRUE(absl::StrContains(st.message(), "dicts have no method 'pop' here"))
        << source << ": " << st;
  }
}

// The status of rendering `source` (which must parse) over Conversation().
absl::Status RenderStatus(const std::string& source,
                          const ChatTemplateInputs& inputs = Conversation()) {
  auto t = ChatTemplate::Parse(source);
  EXPECT_TRUE(t.ok()) << source << ": " << t.status();
  if (!t.ok()) return t.status();
  return (*t)->Render(inputs).status();
}

// Integers are int64: every operation is checked, and one whose result leaves int64 is a
// render error with its place, like `1 // 0`. INT64_MIN // -1 used to kill the process
// (SIGFPE), and + - * and unary - wrapped around.
TEST(ChatTemplateTest, IntegerArithmeticIsCheckedNeverWrapsOrTraps) {
  const std::string min = "(-9223372036854775807 - 1)";
  struct Case {
    std::string expr;
    const char* error;
  } cases[] = {
      {min + " // -1", "integer overflow in '//'"},
      {"9223372036854775807 + 1", "integer overflow in '+'"},
      {min + " - 1", "integer overflow in '-'"},
      {"9223372036854775807 * 3", "integer overflow in '*'"},
      {"-" + min, "integer overflow in '-'"},
      {"1 // 0", "division by zero"},
      {"1 % 0", "division by zero"},
      {"'99999999999999999999' | int", "int of a number outside the 64-bit integers"},
      {"9223372036854775808.0 | int", "int of a number outside the 64-bit integers"},
  };
  for (const Case& c : cases) {
    const absl::Status st = RenderStatus("\n{{ " + c.expr + " }}");
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.expr;
    EXPECT_TRUE(absl::StrContains(st.message(), "line 2, column")) << c.expr << ": " << st;
    EXPECT_TRUE(absl::StrContains(st.message(), c.error)) << c.expr << ": " << st;
  }
  // What stays inside int64 is Python's answer (floor division, the divisor's sign for %).
  EXPECT_EQ(Render("{{ " + min + " % -1 }}|{{ " + min + " // 1 }}|{{ -7 // 2 }}|{{ -7 % 3 }}|"
                   "{{ 7 % -3 }}|{{ 9223372036854775806 + 1 }}|{{ -(-9223372036854775807) }}|"
                   "{{ range(9223372036854775806, 9223372036854775807, 5) | list }}|"
                   "{{ range(-9223372036854775807, " + min + ", -2) | list }}",
                   Conversation()),
            "0|-9223372036854775808|-4|2|-2|9223372036854775807|9223372036854775807|"
            "[9223372036854775806]|[-9223372036854775807]");
  // A slice's step may be any int64: the index stops at int64's end as at the stop (it
  // wrapped around and read out of bounds: SIGSEGV on a string, [3, 2, 1] on this list).
  EXPECT_EQ(Render("{{ 'abc'[1::9223372036854775807] }}|{{ [1, 2, 3][2::9223372036854775807] }}|"
                   "{{ 'abc'[1::" + min + "] }}|{{ [1, 2, 3][::" + min + "] }}|"
                   "{{ 'abcdef'[::9223372036854775806] }}",
                   Conversation()),
            "b|[3]|b|[3]|a");
  // Jinja's int filter: int(x), else int(float(x)), else the default (0 unless given).
  EXPECT_EQ(Render("{{ '42' | int }}|{{ ' -12 ' | int }}|{{ '42.9' | int }}|{{ 'x' | int }}|"
                   "{{ 'x' | int(7) }}|{{ -3.9 | int }}|{{ true | int }}|{{ none | int }}|"
                   "{{ '-9223372036854775808' | int }}",
                   Conversation()),
            "42|-12|42|0|7|-3|1|0|-9223372036854775808");
}

std::string Repeat(absl::string_view piece, int times) {
  std::string out;
  for (int i = 0; i < times; ++i) out.append(piece.data(), piece.size());
  return out;
}

// Runs `fn` on a thread with a `stack_bytes` stack (smaller than any thread the server has).
void OnSmallStack(size_t stack_bytes, const std::function<void()>& fn) {
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, stack_bytes), 0);
  pthread_t thread;
  auto call = [](void* f) -> void* {
    (*static_cast<const std::function<void()>*>(f))();
    return nullptr;
  };
  ASSERT_EQ(pthread_create(&thread, &attr, call, const_cast<std::function<void()>*>(&fn)), 0);
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attr);
}

// Nesting is bounded at parse time, with the place: 4,000 parentheses crashed the parser
// (SIGSEGV at start-up) and a 7,000-term `~` chain parsed, then crashed every render.
TEST(ChatTemplateTest, DeepNestingIsRefusedAtParseTimeWithThePlace) {
  struct Case {
    std::string source;
    const char* place;
  } cases[] = {
      {"{{ " + Repeat("(", 4000) + "1" + Repeat(")", 4000) + " }}", "line 1, column 68:"},
      {"{{ " + Repeat("not ", 200000) + "1 }}", "line 1, column 260:"},
      {"{{ " + Repeat("-", 200000) + "1 }}", "line 1, column 68:"},
      {"{{ " + Repeat("[", 100000) + " }}", "line 1, column 68:"},
      {"{{ x" + Repeat(" ~ ''", 7000) + " }}", "line 1, column 321:"},
      {"{{ x" + Repeat(".a", 100) + " }}", "line 1, column 132:"},
      {"{{ x" + Repeat(" | trim", 100) + " }}", "line 1, column 449:"},
      {"{{ " + Repeat("1 if x else ", 100) + "1 }}", "line 1, column 772:"},
      {"\n" + Repeat("{% if true %}", 50000) + Repeat("{% endif %}", 50000),
       "line 2, column 833:"},
      {Repeat("{% for x in y %}", 65) + Repeat("{% endfor %}", 65), "line 1, column 1025:"},
  };
  for (const Case& c : cases) {
    auto t = ChatTemplate::Parse(c.source);
    ASSERT_FALSE(t.ok()) << c.source.substr(0, 40);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(
        absl::StrContains(t.status().message(), absl::StrCat(c.place, " nested too deeply")))
        << c.source.substr(0, 40) << ": " << t.status().message();
  }
}

// The stack the deepest template must fit: 256 KiB (the server's threads have megabytes);
// under AddressSanitizer or ThreadSanitizer, whose instrumentation makes every frame several
// times larger, 2 MiB.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr size_t kSmallStackBytes = size_t{2} << 20;
#else
constexpr size_t kSmallStackBytes = size_t{256} << 10;
#endif

// What the bound accepts renders on a small stack (kSmallStackBytes): statements nested to
// the limit around an expression nested to the limit, each kind of it.
TEST(ChatTemplateTest, TheDeepestAcceptedTemplateParsesAndRendersOnASmallStack) {
  const int n = jinja::kMaxNesting;
  const std::vector<std::string> exprs = {
      Repeat("(", n - 1) + "1" + Repeat(")", n - 1),
      "'a'" + Repeat(" ~ 'a'", n - 1),
      Repeat("not ", n - 1) + "false",
      Repeat("-", n - 1) + "1",
      Repeat("[", n) + Repeat("]", n),
      "messages" + Repeat(" | list", n - 1),
  };
  for (const std::string& expr : exprs) {
    const std::string source =
        Repeat("{% for m in messages[:1] %}", n / 2) + Repeat("{% if true %}", n - n / 2) +
        "{{ " + expr + " }}" + Repeat("{% endif %}", n - n / 2) + Repeat("{% endfor %}", n / 2);
    OnSmallStack(kSmallStackBytes, [&] {
      auto t = ChatTemplate::Parse(source);
      ASSERT_TRUE(t.ok()) << expr << ": " << t.status();
      EXPECT_TRUE((*t)->Render(Conversation()).ok()) << expr;
    });
    // One level more is refused.
    EXPECT_FALSE(ChatTemplate::Parse("{{ [" + expr + "] }}").ok()) << expr;
  }
}

// Splitting found each tag's line and column by rescanning from the start: 50,000 tags took
// minutes. Now linear: 200,000 tags (2.6 MB) in well under the bound.
TEST(ChatTemplateTest, ManyTagsParseInLinearTime) {
  const std::string source = Repeat("{% if true %}x{% endif %}\n", 100000);
  const auto start = std::chrono::steady_clock::now();
  auto t = ChatTemplate::Parse(source);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_LT(seconds, 10.0);
  auto bad = ChatTemplate::Parse(source + "{{ x");
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "line 100001, column 1:")) << bad.status();
}

// Strings, lists and the rendered prompt are bounded, and so is what one render makes in all:
// each template below aborted the server (std::bad_alloc) or took tens of seconds and GBs.
// Each is now a render error (400) with the place, within seconds.
TEST(ChatTemplateTest, StringsListsAndTheOutputAreBounded) {
  // A namespace whose `s` is `doublings` doublings of `seed` (2^doublings copies).
  auto doubled = [](const char* seed, int doublings) {
    return absl::StrCat("{% set ns = namespace(s='", seed, "') %}{% for i in range(", doublings,
                        ") %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}");
  };
  struct Case {
    std::string source;
    const char* error;
  } cases[] = {
      {doubled("a", 40), "line 1, column 75: a string longer than 16 MiB"},
      {"{% for m in messages %}{% for i in range(100000) %}{{ m.content }}{% endfor %}"
       "{% endfor %}",
       "the rendered prompt would be longer than 16 MiB"},
      {"{% set ns = namespace(s='a') %}{% for i in range(30) %}"
       "{% set ns.s = ns.s.replace('a', 'aa') %}{% endfor %}",
       "a string longer than 16 MiB"},
      {doubled("a", 20) + "{{ range(100) | join(ns.s) }}", "a string longer than 16 MiB"},
      {doubled(",", 21) + "{{ ns.s.split(',') | length }}", "a list of more than 1048576 items"},
      {doubled(" a", 21) + "{{ ns.s.split() | length }}", "a list of more than 1048576 items"},
      {doubled("a", 21) + "{{ ns.s | list | length }}", "a list of more than 1048576 items"},
      {doubled("a", 21) + "{% for c in ns.s %}{% endfor %}", "too many iterations"},
      {"{% set ns = namespace(l=[1]) %}{% for i in range(21) %}{% set ns.l = ns.l + ns.l %}"
       "{% endfor %}",
       "a list of more than 1048576 items"},
      {doubled("a", 23) + "{% for i in range(1000000) %}{% set x = ns.s %}{% endfor %}",
       "the template made more than 256 MiB of strings and lists"},
      {doubled("a", 20) + "{% for i in range(1000000) %}{% for c in [ns.s] %}{% endfor %}"
       "{% endfor %}",
       "the template made more than 256 MiB of strings and lists"},
  };
  ChatTemplateInputs kib;  // one 1 KiB message
  kib.messages = {{"user", std::string(1024, 'x')}};
  const auto start = std::chrono::steady_clock::now();
  for (const Case& c : cases) {
    const absl::Status st = RenderStatus(c.source, kib);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.source;
    EXPECT_TRUE(absl::StrContains(st.message(), c.error)) << c.source << ": " << st;
  }
  // A few seconds in all on a loaded 2-core machine; before, the first case alone aborted.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 120.0);
  // Under the bounds nothing changes: a 4 MiB message through ChatML, a 16 MiB prompt.
  ChatTemplateInputs big;
  big.messages = {{"user", std::string(4 << 20, 'x')}};
  auto chatml = Render("{% for m in messages %}<|im_start|>{{ m.role ~ '\n' ~ m.content }}"
                       "<|im_end|>{% endfor %}",
                       big);
  EXPECT_EQ(chatml.size(), (4u << 20) + 27);
  EXPECT_EQ(Render(doubled("a", 24) + "{{ ns.s }}", Conversation()).size(), 16u << 20);
}

// Lists are shared, not copied: a list of eight names of a list is eight values however big
// the list is, so each level of a template a few lines long multiplies what its value holds
// by eight. Printing (and ~, string, tojson) stops at the string bound instead of building
// the whole text first (a 512 MiB string before the refusal; 4 GiB for tojson aborted the
// server), and the walks over values (printing, ==, `in`, the namespace check) share one
// allowance per render (==, the namespace check and `in` took minutes to centuries).
TEST(ChatTemplateTest, SharedListsCannotOutgrowTheBounds) {
  // ns.s is 1 MiB; l1 holds it, and each l(k+1) is eight names of l(k): l5 holds 4 GiB of
  // text, l4 512 MiB.
  std::string levels =
      "{% set ns = namespace(s='a') %}{% for i in range(20) %}{% set ns.s = ns.s ~ ns.s %}"
      "{% endfor %}{% set l1 = [ns.s] %}";
  for (int k = 1; k < 5; ++k) {
    const std::string l = absl::StrCat("l", k);
    levels += absl::StrCat("{% set l", k + 1, " = [", l, ", ", l, ", ", l, ", ", l, ", ", l, ", ",
                           l, ", ", l, ", ", l, "] %}");
  }
  // A list of lists 2^k items deep, each level two names of the level below (l0 = [1]).
  std::string dag = "{% set d0 = [1] %}";
  for (int k = 1; k <= 40; ++k) {
    dag += absl::StrCat("{% set d", k, " = [d", k - 1, ", d", k - 1, "] %}");
  }
  struct Case {
    std::string source;
    const char* error;
  } cases[] = {
      {levels + "{{ l4 }}", "the rendered prompt would be longer than 16 MiB"},
      {levels + "{{ l5 | tojson }}", "a string longer than 16 MiB"},
      {levels + "{{ l5 | string | length }}", "a string longer than 16 MiB"},
      {levels + "{{ (l5 ~ '') | length }}", "a string longer than 16 MiB"},
      {levels + "{{ [l5] | join(',') | length }}", "a string longer than 16 MiB"},
      {dag + "{{ d40 == d40 }}", "steps printing, comparing or searching values"},
      {dag + "{% set ns = namespace(x=1) %}{% set ns.x = d40 %}",
       "steps printing, comparing or searching values"},
      {dag + "{{ d40 | tojson | length }}", "a string longer than 16 MiB"},
      {dag + "{{ d40 | length }}{{ d40 }}", "the rendered prompt would be longer than 16 MiB"},
      {"{% set big = range(1000000) %}{% for i in range(1000) %}{{ -1 in big }}{% endfor %}",
       "steps printing, comparing or searching values"},
  };
  const auto start = std::chrono::steady_clock::now();
  for (const Case& c : cases) {
    const absl::Status st = RenderStatus(c.source);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.source.substr(0, 300);
    EXPECT_TRUE(absl::StrContains(st.message(), c.error)) << c.source.substr(0, 300) << ": " << st;
  }
  // The second review of the allowance: walks and copies are spent by bytes too (64 a step),
  // searches by their worst case, keys are scalars (Python's unhashable lists and dicts: a list
  // key's text was 16 MiB for a few names, stored uncounted), and a cut text never reaches a
  // filter that could shrink it back under the bound.
  const std::string two = "{% set ns = namespace(s='a') %}{% for i in range(22) %}"
                          "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{% set ns.t = ns.s ~ '' %}"
                          "{% set la = [ns.s, ns.s, ns.s, ns.s] %}{% set lb = [ns.t, ns.t, ns.t, ns.t] %}";
  const std::string search = "{% set ns = namespace(h='a', n='a') %}{% for i in range(18) %}"
                             "{% set ns.h = ns.h ~ ns.h %}{% endfor %}{% for i in range(17) %}"
                             "{% set ns.n = ns.n ~ ns.n %}{% endfor %}{% set ns.n = ns.n ~ 'b' %}";
  const Case second[] = {
      {two + "{% for i in range(100000) %}{% if la == lb %}{% endif %}{% endfor %}",
       "steps printing, comparing or searching values"},
      {search + "{% for i in range(1000) %}{% if ns.n in ns.h %}{% endif %}{% endfor %}",
       "steps printing, comparing or searching values"},
      {search + "{% for i in range(1000) %}{{ ns.h.split(ns.n) | length }}{% endfor %}",
       "steps printing, comparing or searching values"},
      {"{{ {[1]: 2} }}", "a list cannot be a dict key"},
      {"{{ [1] in {} }}", "a list cannot be a dict key"},
      {"{{ {}[{}] }}", "a dict cannot be a dict key"},
      {"{{ {}.get([1]) }}", "a list cannot be a dict key"},
      {levels + "{{ l5 | trim | length }}", "a string longer than 16 MiB"},
      {levels + "{{ l5 | replace(' ', '') | length }}", "a string longer than 16 MiB"},
      {levels + "{{ 'x'.strip(l5) }}", "a string longer than 16 MiB"},
  };
  for (const Case& c : second) {
    const absl::Status st = RenderStatus(c.source);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.source.substr(0, 300);
    EXPECT_TRUE(absl::StrContains(st.message(), c.error)) << c.source.substr(0, 300) << ": " << st;
  }
  // Seconds in all on a loaded 2-core machine (a hang guard, not a speed goal).
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 120.0);
  // Within the allowance nothing changes: `in` stops at the first match, and a walk that fits
  // is whole.
  EXPECT_EQ(Render("{% set big = range(1000000) %}{% for i in range(1000) %}"
                   "{% if not (0 in big) %}x{% endif %}{% endfor %}{{ 999999 in big }}",
                   Conversation()),
            "True");
  EXPECT_EQ(Render(dag + "{{ d2 }}|{{ d2 | tojson }}|{{ d16 == d16 }}", Conversation()),
            "[[[1], [1]], [[1], [1]]]|[[[1],[1]],[[1],[1]]]|True");
  // tojson of invalid UTF-8 (a reversed or byte-sliced character) threw out of the render
  // and aborted the server: the bytes become U+FFFD.
  EXPECT_EQ(Render("{{ ('\xC3\xA9' | reverse) | tojson }}|{{ '\xC3\xA9'[:1] | tojson }}",
                   Conversation()),
            "\"\xEF\xBF\xBD\xEF\xBF\xBD\"|\"\xEF\xBF\xBD\"");
}

// Values built at render time are bounded too: a namespace that held itself, or a list nested
// 200,000 deep by a loop, crashed the render (printing or freeing it recursed without end).
TEST(ChatTemplateTest, ValuesCannotNestDeeplyOrHoldThemselves) {
  struct Case {
    const char* source;
    const char* error;
  } cases[] = {
      {"{% set ns = namespace(a=1) %}{% set ns.self = ns %}{{ ns }}",
       "line 1, column 30: a namespace attribute cannot hold a namespace"},
      {"{% set ns = namespace(a=1) %}{% set ns.a = [{'k': ns}] %}",
       "line 1, column 30: a namespace attribute cannot hold a namespace"},
      {"{% set ns = namespace(l=[]) %}{% for i in range(200000) %}{% set ns.l = [ns.l] %}"
       "{% endfor %}",
       "line 1, column 73: a value nested too deeply"},
      {"{% set ns = namespace(l=[]) %}{% for i in range(200000) %}"
       "{% set ns.l = {'a': ns.l}.items() %}{% endfor %}",
       "a value nested too deeply"},
  };
  for (const Case& c : cases) {
    const absl::Status st = RenderStatus(c.source);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.source;
    EXPECT_TRUE(absl::StrContains(st.message(), c.error)) << c.source << ": " << st;
  }
  // A namespace made holding another is fine (no cycle can follow), as is nesting to the bound.
  EXPECT_EQ(Render("{% set a = namespace(x=1) %}{% set b = namespace(y=a) %}{{ b.y.x }}|"
                   "{% set ns = namespace(l=[]) %}{% for i in range(63) %}{% set ns.l = [ns.l] %}"
                   "{% endfor %}{{ (ns.l | string | length) }}",
                   Conversation()),
            "1|128");
  // A loop over the deepest value a render may hold: its items are a level less deep, so its
  // `loop` (which holds previtem and nextitem) stays within the bound.
  EXPECT_EQ(Render("{% set ns = namespace(l=[]) %}{% for i in range(63) %}{% set ns.l = [ns.l, 1] %}"
                   "{% endfor %}{% for x in ns.l %}{{ loop.index }}{{ loop.previtem | length }}"
                   "{% endfor %}",
                   Conversation()),
            "10" "22");
}

// Template files must be regular and small: --chat-template /dev/zero grew memory forever and
// a FIFO blocked start-up; both, and a directory or an oversized file, are now refused at once
// naming the file (tokenizer_config.json the same, with its own limit).
TEST(ChatTemplateTest, TemplateFilesMustBeRegularAndSmall) {
  const std::string dir = ::testing::TempDir() + "/chat_template_files";
  ASSERT_EQ(std::system(("rm -rf " + dir + " && mkdir -p " + dir + "/model").c_str()), 0);
  const std::string fifo = dir + "/fifo.jinja";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const std::string big = dir + "/big.jinja";
  std::ofstream(big) << std::string(kMaxChatTemplateFileBytes + 1, 'x');
  const std::string ok = dir + "/ok.jinja";
  std::ofstream(ok) << std::string(kMaxChatTemplateFileBytes, 'x');
  struct Case {
    std::string path;
    const char* error;
  } cases[] = {
      {"/dev/zero", "is not a regular file"},
      {fifo, "is not a regular file"},
      {dir, "is not a regular file"},
      {big, "is larger than 1048576 bytes"},
  };
  std::string bos, eos;
  for (const Case& c : cases) {
    absl::StatusOr<std::string> s = LoadChatTemplateSource(dir + "/model", c.path, &bos, &eos);
    ASSERT_FALSE(s.ok()) << c.path;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << c.path;
    EXPECT_TRUE(absl::StrContains(s.status().message(), "--chat-template: '" + c.path + "'"))
        << s.status();
    EXPECT_TRUE(absl::StrContains(s.status().message(), c.error)) << s.status();
  }
  absl::StatusOr<std::string> fine = LoadChatTemplateSource(dir + "/model", ok, &bos, &eos);
  ASSERT_TRUE(fine.ok()) << fine.status();
  EXPECT_EQ(fine->size(), kMaxChatTemplateFileBytes);
  // The model directory's files: a FIFO tokenizer_config.json, a directory for the template.
  ASSERT_EQ(mkfifo((dir + "/model/tokenizer_config.json").c_str(), 0600), 0);
  absl::StatusOr<std::string> s = LoadChatTemplateSource(dir + "/model", "", &bos, &eos);
  EXPECT_TRUE(absl::StrContains(s.status().message(), "tokenizer_config.json' is not a regular"))
      << s.status();
  ASSERT_EQ(std::remove((dir + "/model/tokenizer_config.json").c_str()), 0);
  ASSERT_EQ(mkdir((dir + "/model/chat_template.jinja").c_str(), 0700), 0);
  s = LoadChatTemplateSource(dir + "/model", "", &bos, &eos);
  EXPECT_TRUE(absl::StrContains(s.status().message(), "chat_template.jinja' is not a regular"))
      << s.status();
  ASSERT_EQ(std::system(("rm -rf " + dir).c_str()), 0);
}

// tokenizer_config.json's named templates without a "default" stopped the server, where a
// model without a template should serve /v1/completions only (NotFound here); transformers
// has no default template there either. A malformed list is still an error.
TEST(ChatTemplateTest, NamedTemplatesWithoutADefaultAreNoTemplate) {
  const std::string dir = ::testing::TempDir() + "/chat_template_named";
  ASSERT_EQ(std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str()), 0);
  auto load = [&](const std::string& config) {
    std::ofstream(dir + "/tokenizer_config.json") << config;
    std::string bos, eos;
    return LoadChatTemplateSource(dir, "", &bos, &eos);
  };
  absl::StatusOr<std::string> s = load(R"({"chat_template": [{"name": "tool_use", "template": "a"},
                                                              {"name": "rag", "template": "b"}]})");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound) << s.status();
  EXPECT_TRUE(absl::StrContains(s.status().message(),
                                "names chat templates (tool_use, rag) but none \"default\""))
      << s.status();
  s = load(R"({"chat_template": [{"name": "rag", "template": "b"},
                                  {"name": "default", "template": "d"}]})");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, "d");
  s = load(R"({"chat_template": [{"name": "default", "template": 5}]})");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  s = load(R"({"chat_template": 5})");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  ASSERT_EQ(std::system(("rm -rf " + dir).c_str()), 0);
}

}  // namespace
}  // namespace dcf::server
