#include "engine/common/id_list.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace dcf {

absl::StatusOr<std::vector<int32_t>> ParseIdList(absl::string_view flag, absl::string_view text) {
  std::vector<int32_t> ids;
  if (absl::StripAsciiWhitespace(text).empty()) return ids;
  for (absl::string_view piece : absl::StrSplit(text, ',')) {
    piece = absl::StripAsciiWhitespace(piece);
    int32_t id;
    if (!absl::SimpleAtoi(piece, &id)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": '", piece, "' is not an integer token id"));
    }
    ids.push_back(id);
  }
  return ids;
}

}  // namespace dcf
