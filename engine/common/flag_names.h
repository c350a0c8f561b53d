// Lets command-line tools accept GNU-style dashed flag names (--max-new-tokens) with Abseil
// flags, whose names use underscores (max_new_tokens).
#pragma once

#include <string>
#include <vector>

namespace dcf {

// Returns argv with every "--a-b[=value]" that names a registered flag rewritten to
// "--a_b[=value]" (only the name part). Values, including the argument after a non-boolean
// "--flag value", positional arguments and everything after a bare "--" stay as typed.
// Call after the flags are defined (any time in main).
// The returned pointers point into `storage`, which must outlive them.
std::vector<char*> NormalizeFlagNames(int argc, char** argv, std::vector<std::string>& storage);

}  // namespace dcf
