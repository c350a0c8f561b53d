#include "engine/common/flag_names.h"

#include <cstdlib>

#include "absl/flags/flag.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

ABSL_FLAG(std::string, test_prompt_text, "", "a string flag");
ABSL_FLAG(bool, test_json_output, false, "a bool flag");
ABSL_FLAG(int, test_count, 0, "an int flag");
ABSL_FLAG(absl::Duration, test_wait, absl::ZeroDuration(), "a duration flag with a bare value");

namespace dcf {
namespace {

absl::StatusOr<CommandLine> Read(std::vector<std::string> args,
                                 const BareFlagValues& bare_values = {}) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return ReadCommandLine(static_cast<int>(argv.size()), argv.data(), bare_values);
}

// What absl::ParseCommandLine gets, without the program name.
std::vector<std::string> Absl(std::vector<std::string> args,
                              const BareFlagValues& bare_values = {}) {
  absl::StatusOr<CommandLine> line = Read(std::move(args), bare_values);
  EXPECT_TRUE(line.ok()) << line.status();
  if (!line.ok()) return {};
  std::vector<std::string> out = AbslArgs("prog", *line);
  return std::vector<std::string>(out.begin() + 1, out.end());
}

absl::Status Check(std::vector<std::string> args) {
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return CheckFlagArgs(static_cast<int>(argv.size()), argv.data());
}

TEST(FlagNamesTest, DashedNamesValuesAndPositionals) {
  EXPECT_EQ(Absl({"prog", "--test-prompt-text=a-b", "--test-json-output", "pos-arg",
                  "--unknown-flag"}),
            (std::vector<std::string>{"--test_prompt_text=a-b", "--test_json_output",
                                      "--unknown_flag", "--", "pos-arg"}));
  // The word after a flag that takes a value is that value, even when it looks like a flag.
  EXPECT_EQ(Absl({"prog", "--test-prompt-text", "--test-json-output", "--test-json-output"}),
            (std::vector<std::string>{"--test_prompt_text=--test-json-output",
                                      "--test_json_output", "--"}));
  EXPECT_EQ(Absl({"prog", "--test-prompt-text", "-h"}),
            (std::vector<std::string>{"--test_prompt_text=-h", "--"}));
  // A boolean never takes the next word; after "--" everything is positional.
  EXPECT_EQ(Absl({"prog", "--notest-json-output", "x", "--", "--test-json-output"}),
            (std::vector<std::string>{"--notest_json_output", "--", "x",
                                      "--test-json-output"}));
}

TEST(FlagNamesTest, GivenFlagNamesSkipsValuesAndRecordsNegatedBools) {
  absl::StatusOr<CommandLine> line =
      Read({"prog", "--test_prompt_text", "--test_json_output", "pos-arg",
            "--notest_json_output", "--unknown", "--", "--test_prompt_text=x"});
  ASSERT_TRUE(line.ok());
  EXPECT_EQ(GivenFlagNames(*line),
            (absl::flat_hash_set<std::string>{"test_prompt_text", "notest_json_output",
                                              "test_json_output"}));
  line = Read({"prog", "--test_prompt_text", "--test_json_output"});
  ASSERT_TRUE(line.ok());
  EXPECT_EQ(GivenFlagNames(*line), (absl::flat_hash_set<std::string>{"test_prompt_text"}));
}

TEST(FlagNamesTest, CheckFlagArgsAcceptsWhatAbslParses) {
  EXPECT_TRUE(Check({"prog", "--test_count=3", "--test_count", "4", "--test_json_output",
                     "--notest_json_output", "--test_json_output=false", "pos", "--", "--unknown"})
                  .ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), 4);
  // Review finding 2: --undefok lets the flags it names through (and their "no" form).
  EXPECT_TRUE(Check({"prog", "--undefok=bogus,other", "--bogus", "--nobogus", "--other=1"}).ok());
  EXPECT_TRUE(Check({"prog", "--bogus=2", "--undefok", "bogus"}).ok());
  EXPECT_EQ(Absl({"prog", "--undefok=bogus", "--bogus", "--test_count=5"}),
            (std::vector<std::string>{"--test_count=5", "--"}));
}

TEST(FlagNamesTest, CheckFlagArgsNamesTheBadFlag) {
  const struct {
    std::vector<std::string> args;
    const char* message;
  } cases[] = {
      {{"prog", "--no_such_flag=1"}, "unknown flag --no-such-flag"},
      {{"prog", "--undefok=other", "--no_such_flag=1"}, "unknown flag --no-such-flag"},
      {{"prog", "--test_count=abc"}, "--test-count: "},
      {{"prog", "--test_count"}, "--test-count needs a value"},
      {{"prog", "--test_json_output=maybe"}, "--test-json-output: "},
      {{"prog", "--notest_json_output=true"}, "--notest-json-output takes no value"},
      {{"prog", "--flagfile"}, "--flagfile needs a value"},
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
  dir.Write("dashed.flags", "--test-count=8\n");
  dir.Write("unknown.flags", "--test_count=1\n--no_such_flag=2\n");
  dir.Write("undefok.flags", "--undefok=no_such_flag\n");
  dir.Write("bad_value.flags", "--test_count=many\n");
  dir.Write("nested.flags", "--flagfile=" + dir.File("unknown.flags") + "\n");
  dir.Write("not_a_flag.flags", "test_count=1\n");
  EXPECT_TRUE(Check({"prog", "--flagfile=" + dir.File("good.flags")}).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), 7);
  EXPECT_TRUE(Check({"prog", "--flagfile", dir.File("good.flags"), "pos"}).ok());
  // Flagfiles take dashed names too (they are spliced into the command line).
  EXPECT_TRUE(Check({"prog", "--flagfile=" + dir.File("dashed.flags")}).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), 8);
  // --undefok in a flagfile covers the command line, and the other way round.
  EXPECT_TRUE(
      Check({"prog", "--flagfile=" + dir.File("undefok.flags"), "--no_such_flag=3"}).ok());
  EXPECT_TRUE(
      Check({"prog", "--undefok=no_such_flag", "--flagfile=" + dir.File("unknown.flags")}).ok());
  const struct {
    std::string file;
    std::string message;
  } cases[] = {
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

// Review finding 3: a flagfile is read once, its lines in its place, so that the last value
// wins as absl's own reading has it, and a pipe (<(...), /dev/stdin) works.
TEST(FlagNamesTest, FlagfilesAreSplicedInPlaceAndReadOnce) {
  testing::TempDir dir;
  dir.Write("two.flags", "--test_count=2\n--test-prompt-text\nhello\n");
  EXPECT_EQ(Absl({"prog", "--test_count=1", "--flagfile=" + dir.File("two.flags"), "pos",
                  "--test_count=3"}),
            (std::vector<std::string>{"--test_count=1", "--test_count=2",
                                      "--test_prompt_text=hello", "--test_count=3", "--",
                                      "pos"}));
  absl::StatusOr<CommandLine> line = Read({"prog", "--flagfile=" + dir.File("two.flags")});
  ASSERT_TRUE(line.ok());
  // Review finding 11: what a flagfile sets counts as given.
  EXPECT_TRUE(GivenFlagNames(*line).contains("test_prompt_text"));
  EXPECT_EQ(line->flags[0].where, dir.File("two.flags"));
}

// Review finding 14: --fromenv values are checked like the others.
TEST(FlagNamesTest, FromenvValuesAreCheckedAndMissingOnesNamed) {
  ::setenv("FLAGS_test_count", "xyz", 1);
  absl::Status s = Check({"prog", "--fromenv=test_count"});
  EXPECT_EQ(s.message().rfind("FLAGS_test_count: --test-count: ", 0), 0u) << s.message();
  ::setenv("FLAGS_test_count", "9", 1);
  EXPECT_TRUE(Check({"prog", "--fromenv=test_count"}).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), 9);
  ::unsetenv("FLAGS_test_count");
  s = Check({"prog", "--fromenv=test_count"});
  EXPECT_NE(s.message().find("FLAGS_test_count is not set"), absl::string_view::npos)
      << s.message();
  EXPECT_TRUE(Check({"prog", "--tryfromenv=test_count"}).ok());
}

// Review findings 6 and 14: a flag with a bare value takes the next word only when it is one of
// its values, and stands alone in a flagfile too.
TEST(FlagNamesTest, BareValues) {
  const BareFlagValues bare = {{"test_wait", "1m"}};
  EXPECT_EQ(Absl({"prog", "--test-wait", "health"}, bare),
            (std::vector<std::string>{"--test_wait=1m", "--", "health"}));
  EXPECT_EQ(Absl({"prog", "--test-wait", "2s", "health"}, bare),
            (std::vector<std::string>{"--test_wait=2s", "--", "health"}));
  EXPECT_EQ(Absl({"prog", "--test-wait=5s", "health"}, bare),
            (std::vector<std::string>{"--test_wait=5s", "--", "health"}));
  testing::TempDir dir;
  dir.Write("bare.flags", "--test_wait\n");
  EXPECT_EQ(Absl({"prog", "--flagfile=" + dir.File("bare.flags")}, bare),
            (std::vector<std::string>{"--test_wait=1m", "--"}));
}

// Review finding 12: every help flag Abseil has lists the tool's flags (no "No flags matched").
TEST(FlagNamesTest, HelpFlags) {
  for (const char* flag : {"--help", "-h", "--helpshort", "--helppackage", "-help"}) {
    absl::StatusOr<CommandLine> line = Read({"prog", flag});
    ASSERT_TRUE(line.ok());
    EXPECT_TRUE(line->help) << flag;
  }
  absl::StatusOr<CommandLine> line = Read({"prog", "--helpfull"});
  EXPECT_TRUE(line->helpfull);
  line = Read({"prog", "--test_prompt_text", "--help"});
  EXPECT_FALSE(line->help);  // the prompt's value
  EXPECT_EQ(Absl({"prog", "--version"}), (std::vector<std::string>{"--version", "--"}));
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
