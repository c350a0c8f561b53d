// Lets command-line tools accept GNU-style dashed flag names (--max-new-tokens) with Abseil
// flags, whose names use underscores (max_new_tokens).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dcf {

// Returns argv with every "--a-b[=value]" that names a registered flag rewritten to
// "--a_b[=value]" (only the name part). Values, including the argument after a non-boolean
// "--flag value", positional arguments and everything after a bare "--" stay as typed.
// Call after the flags are defined (any time in main).
// The returned pointers point into `storage`, which must outlive them.
std::vector<char*> NormalizeFlagNames(int argc, char** argv, std::vector<std::string>& storage);

// Names of the registered flags that `argv` (as NormalizeFlagNames returns it) sets, in their
// underscore form; "--noX" for a boolean X records both "noX" and "X". Lets a tool leave
// options the user did not give unset (Debian's Abseil keeps "was this flag given" private).
absl::flat_hash_set<std::string> GivenFlagNames(int argc, char** argv);

// Checks the flags of `argv` (as NormalizeFlagNames returns it) the way absl::ParseCommandLine
// will, so that a tool can report a bad command line with its own exit code (absl exits 1):
// InvalidArgument "unknown flag --x", "--x needs a value" or "--x: <absl's parse error>".
// The lines of every --flagfile are checked the same way ("FILE: unknown flag --x"; an
// unreadable flagfile is an error too). Parsing sets the flags it checks (ParseCommandLine then
// sets them to the same values). --fromenv, --tryfromenv, --undefok and absl's usage flags
// (--help, --helpfull, --version, ...) are left to absl.
absl::Status CheckFlagArgs(int argc, char** argv);

// The --help text of a tool: "<program>: <usage>", then every flag of the program (every
// registered flag that Abseil itself does not define; with `include_absl`, those too), sorted,
// in the dashed spelling users type, each with its default and its help.
std::string ToolHelp(absl::string_view program, absl::string_view usage, bool include_absl);

// Reads a tool's command line the way every dcformer program does:
//  * flag names with dashes or underscores (NormalizeFlagNames);
//  * --help or -h prints ToolHelp to stdout and exits 0 (--helpfull: with Abseil's flags);
//  * a bad flag (CheckFlagArgs) prints "<program>: <what> (--help lists the flags)" to stderr
//    and exits 2, where absl would exit 1.
// `usage` is a one-line summary followed by usage lines. Returns the positional arguments,
// argv[0] first, pointing into `storage` (which must outlive them); `given`, when not null,
// receives GivenFlagNames of the command line. `bare_values` lists flags (underscore names)
// that may also be given without a value, and the value that means: {"wait_ready", "1m"} makes
// `--wait-ready` stand for `--wait-ready=1m`.
using BareFlagValues = std::vector<std::pair<std::string, std::string>>;
std::vector<char*> ParseToolCommandLine(int argc, char** argv, absl::string_view usage,
                                        std::vector<std::string>& storage,
                                        absl::flat_hash_set<std::string>* given = nullptr,
                                        const BareFlagValues& bare_values = {});

}  // namespace dcf
