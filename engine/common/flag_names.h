// Lets command-line tools accept GNU-style dashed flag names (--max-new-tokens) with Abseil
// flags, whose names use underscores (max_new_tokens).
#pragma once

#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"

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
// Parsing sets the flags it checks (ParseCommandLine then sets them to the same values).
// --flagfile, --fromenv, --tryfromenv, --undefok and absl's usage flags (--help, --helpfull,
// --version, ...) are left to absl.
absl::Status CheckFlagArgs(int argc, char** argv);

}  // namespace dcf
