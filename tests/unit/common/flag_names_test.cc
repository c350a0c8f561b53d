#include "engine/common/flag_names.h"

#include "absl/flags/flag.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

ABSL_FLAG(std::string, test_prompt_text, "", "a string flag");
ABSL_FLAG(bool, test_json_output, false, "a bool flag");
ABSL_FLAG(int, test_count, 0, "an int flag");

namespace dcf {
namespace {

std::vector<std::string> Normalize(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  std::vector<std::string> storage;
  std::vector<char*> out = NormalizeFlagNames(static_cast<int>(argv.size()), argv.data(), storage);
  return std::vector<std::string>(out.begin(), out.end() - 1);
}

TEST(FlagNamesTest, RewritesRegisteredDashedNamesOnly) {
  EXPECT_EQ(Normalize({"prog", "--test-prompt-text=a-b", "--test-json-output", "-x-y", "pos-arg",
                       "--unknown-flag"}),
            (std::vector<std::string>{"prog", "--test_prompt_text=a-b", "--test_json_output",
                                      "-x-y", "pos-arg", "--unknown-flag"}));
}

TEST(FlagNamesTest, ValueAfterAStringFlagIsNeverRewritten) {
  // "--test-prompt-text --test-json-output": the second word is the prompt, not a flag.
  EXPECT_EQ(Normalize({"prog", "--test-prompt-text", "--test-json-output", "--test-json-output"}),
            (std::vector<std::string>{"prog", "--test_prompt_text", "--test-json-output",
                                      "--test_json_output"}));
  EXPECT_EQ(Normalize({"prog", "--test-prompt-text", "-well-known"}),
            (std::vector<std::string>{"prog", "--test_prompt_text", "-well-known"}));
}

TEST(FlagNamesTest, NegatedBoolsAndDoubleDash) {
  EXPECT_EQ(Normalize({"prog", "--notest-json-output", "--", "--test-json-output"}),
            (std::vector<std::string>{"prog", "--notest_json_output", "--",
                                      "--test-json-output"}));
}

TEST(FlagNamesTest, GivenFlagNamesSkipsValuesAndRecordsNegatedBools) {
  std::vector<std::string> args = {"prog",    "--test_prompt_text",   "--test_json_output",
                                   "pos-arg", "--notest_json_output", "--unknown",
                                   "--",      "--test_prompt_text=x"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  const absl::flat_hash_set<std::string> given =
      GivenFlagNames(static_cast<int>(argv.size()), argv.data());
  // "--test_json_output" right after a string flag is that flag's value.
  EXPECT_EQ(given, (absl::flat_hash_set<std::string>{"test_prompt_text", "notest_json_output",
                                                     "test_json_output"}));
  std::vector<std::string> only_value = {"prog", "--test_prompt_text", "--test_json_output"};
  argv.clear();
  for (std::string& a : only_value) argv.push_back(a.data());
  EXPECT_EQ(GivenFlagNames(static_cast<int>(argv.size()), argv.data()),
            (absl::flat_hash_set<std::string>{"test_prompt_text"}));
}

absl::Status Check(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return CheckFlagArgs(static_cast<int>(argv.size()), argv.data());
}

TEST(FlagNamesTest, CheckFlagArgsAcceptsWhatAbslParses) {
  EXPECT_TRUE(Check({"prog", "--test_count=3", "--test_count", "4", "--test_json_output",
                     "--notest_json_output", "--test_json_output=false", "pos", "--", "--unknown"})
                  .ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), 4);
}

TEST(FlagNamesTest, CheckFlagArgsNamesTheBadFlag) {
  const struct {
    std::vector<std::string> args;
    const char* message;
  } cases[] = {
      {{"prog", "--no_such_flag=1"}, "unknown flag --no-such-flag"},
      {{"prog", "--test_count=abc"}, "--test-count: "},
      {{"prog", "--test_count"}, "--test-count needs a value"},
      {{"prog", "--test_json_output=maybe"}, "--test-json-output: "},
      {{"prog", "--notest_json_output=true"}, "--notest-json-output takes no value"},
  };
  for (const auto& c : cases) {
    const absl::Status s = Check(c.args);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_NE(s.message().find(c.message), absl::string_view::npos) << s.message();
  }
}

// Issue 24: a bad line in a --flagfile is a usage error of the tool (exit 2) like a bad flag
// on the command line, not absl's exit 1.
TEST(FlagNamesTest, CheckFlagArgsChecksFlagfiles) {
  testing::TempDir dir;
  dir.Write("good.flags", "# a comment\n\n  --test_count=7\n--test_json_output\n");
  dir.Write("dashed.flags", "--test-count=7\n");
  dir.Write("unknown.flags", "--test_count=1\n--no_such_flag=2\n");
  dir.Write("bad_value.flags", "--test_count=many\n");
  dir.Write("nested.flags", "--flagfile=" + dir.File("unknown.flags") + "\n");
  dir.Write("not_a_flag.flags", "test_count=1\n");
  EXPECT_TRUE(Check({"prog", "--flagfile=" + dir.File("good.flags")}).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), 7);
  EXPECT_TRUE(Check({"prog", "--flagfile", dir.File("good.flags"), "pos"}).ok());
  const struct {
    std::string file;
    std::string message;
  } cases[] = {
      {"dashed.flags", dir.File("dashed.flags") +
                           ": unknown flag --test-count (flagfiles spell flag names with "
                           "underscores: --test_count)"},
      {"unknown.flags", dir.File("unknown.flags") + ": unknown flag --no-such-flag"},
      {"bad_value.flags", dir.File("bad_value.flags") + ": --test-count: "},
      {"nested.flags", dir.File("unknown.flags") + ": unknown flag --no-such-flag"},
      {"not_a_flag.flags", dir.File("not_a_flag.flags") + ": 'test_count=1' is not a flag"},
      {"missing.flags", "--flagfile: "},
  };
  for (const auto& c : cases) {
    const absl::Status s = Check({"prog", "--flagfile=" + dir.File(c.file)});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.file;
    EXPECT_EQ(s.message().substr(0, c.message.size()), c.message) << s.message();
  }
}

TEST(FlagNamesTest, ToolHelpListsTheProgramsFlagsDashed) {
  const std::string help = ToolHelp("prog", "does things\n  prog --x", false);
  EXPECT_EQ(help.rfind("prog: does things\n  prog --x\n\n", 0), 0u) << help;
  EXPECT_NE(help.find("\n  --test-prompt-text (default \"\")\n      a string flag\n"),
            std::string::npos)
      << help;
  EXPECT_NE(help.find("\n  --test-count (default 0)\n      an int flag\n"), std::string::npos);
  EXPECT_EQ(help.find("--flagfile (default"), std::string::npos);  // Abseil's own
  EXPECT_NE(ToolHelp("prog", "x", true).find("--flagfile (default"), std::string::npos);
}

}  // namespace
}  // namespace dcf
