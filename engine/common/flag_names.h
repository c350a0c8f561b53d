// Lets command-line tools accept GNU-style dashed flag names (--max-new-tokens) with Abseil
// flags, whose names use underscores (max_new_tokens).
#pragma once

#include <string>
#include <vector>

namespace dcf {

// Returns argv with every "--a-b[=value]" rewritten to "--a_b[=value]" (only the name part;
// values and positional arguments are untouched; everything after a bare "--" is left as is).
// The returned pointers point into `storage`, which must outlive them.
std::vector<char*> NormalizeFlagNames(int argc, char** argv, std::vector<std::string>& storage);

}  // namespace dcf
