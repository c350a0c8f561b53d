// Parsing of comma-separated token-id lists given on command lines ("1, 2,3").
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dcf {

// Ids of `text` (pieces trimmed of ASCII whitespace); an empty or all-blank text is an empty
// list. InvalidArgument "--<flag>: 'x' is not an integer token id" for any other piece.
absl::StatusOr<std::vector<int32_t>> ParseIdList(absl::string_view flag, absl::string_view text);

}  // namespace dcf
