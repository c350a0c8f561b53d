// How every dcformer program reads its command line: one tokenizer over the arguments, the
// --flagfile files it names (read once, their lines spliced in where the flag stood) and the
// environment variables --fromenv/--tryfromenv name; then one check, and Abseil's parser run on
// what the tokenizer produced. Flag names may be spelled with dashes (--max-new-tokens) or
// underscores (max_new_tokens, Abseil's spelling), on the command line and in flagfiles.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/flags/commandlineflag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dcf {

// Flags (underscore names) that may also be given without a value, and the value that means:
// {"wait_ready", "1m"} makes `--wait-ready` stand for `--wait-ready=1m`. On the command line
// the next word is the flag's value when it parses as one (`--wait-ready 2s`).
using BareFlagValues = std::vector<std::pair<std::string, std::string>>;

// One flag as the tokenizer read it.
struct FlagArg {
  std::string name;  // as typed, dashes turned into underscores ("noX" for a negated boolean)
  const absl::CommandLineFlag* flag = nullptr;  // the registered flag; null when unknown
  bool has_value = false;
  std::string value;
  std::string where;  // "" on the command line; else the flagfile's path or "FLAGS_x"
};

// A tool's command line, tokenized.
struct CommandLine {
  std::vector<FlagArg> flags;           // in order; flagfiles and --fromenv spliced in
  std::vector<std::string> positional;  // after the program name, in order
  absl::flat_hash_set<std::string> undefok;  // names --undefok lists (anywhere)
  std::vector<std::string> absl_usage;  // Abseil's own usage flags (--version, --helpon=x, ...)
  bool help = false;                    // --help, -h, --helpshort, --helppackage
  bool helpfull = false;                // --helpfull
};

// Tokenizes argv[1..argc): a word after "--" is positional; "--x=v" or "-x=v" sets x; a flag
// that is not a boolean and has no "=" takes the next word (of the command line or of the same
// flagfile) as its value; a boolean never does. A flagfile holds one flag per line (`#`
// comments and blank lines skipped). Errors: an unreadable or too deeply nested flagfile, a
// flagfile line that is not a flag, a variable --fromenv names that is unset.
absl::StatusOr<CommandLine> ReadCommandLine(int argc, char** argv,
                                            const BareFlagValues& bare_values = {});

// Checks the flags the way absl::ParseCommandLine will, so that a tool can report a bad command
// line with its own exit code (absl exits 1): InvalidArgument "unknown flag --x" (unless
// --undefok lists it), "--x needs a value", "--x takes no value" or "--x: <absl's parse error>",
// prefixed "FILE: " for a flagfile's line and "FLAGS_x: " for an environment variable. Checking
// sets the flags (absl::ParseCommandLine then sets them to the same values).
absl::Status CheckCommandLine(const CommandLine& line);

// ReadCommandLine and CheckCommandLine.
absl::Status CheckFlagArgs(int argc, char** argv);

// Names (underscore form) of the registered flags the command line sets, its flagfiles and
// environment variables included; "--noX" for a boolean X records both "noX" and "X". Lets a
// tool leave options the user did not give unset (Debian's Abseil keeps "was this flag given"
// private).
absl::flat_hash_set<std::string> GivenFlagNames(const CommandLine& line);

// The argv absl::ParseCommandLine gets for `line`: the program name, every flag as
// "--name=value" (or "--name" for a boolean), Abseil's usage flags, then "--" and the
// positional arguments. Unknown flags that --undefok lists are left out.
std::vector<std::string> AbslArgs(absl::string_view program, const CommandLine& line);

// The --help text of a tool: "<program>: <usage>", then every flag of the program (every
// registered flag that Abseil itself does not define; with `include_absl`, those too), sorted,
// in the dashed spelling users type, each with its default and its help.
std::string ToolHelp(absl::string_view program, absl::string_view usage, bool include_absl);

// Reads a tool's command line the way every dcformer program does:
//  * ReadCommandLine, then --help, -h, --helpshort or --helppackage prints ToolHelp to stdout
//    and exits 0 (--helpfull: with Abseil's flags);
//  * a bad command line (ReadCommandLine, CheckCommandLine) prints "<program>: <what> (--help
//    lists the flags)" to stderr and exits 2, where absl would exit 1;
//  * absl::ParseCommandLine on AbslArgs sets the flags (and handles --version, ...).
// `usage` is a one-line summary followed by usage lines. Returns the positional arguments,
// argv[0] first, pointing into `storage` (which must outlive them); `given`, when not null,
// receives GivenFlagNames.
std::vector<char*> ParseToolCommandLine(int argc, char** argv, absl::string_view usage,
                                        std::vector<std::string>& storage,
                                        absl::flat_hash_set<std::string>* given = nullptr,
                                        const BareFlagValues& bare_values = {});

}  // namespace dcf
