#include "engine/common/log_text.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dcf {
namespace {

bool IsPlain(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' ||
         c == ':' || c == '/' || c == '@' || c == '+' || c == '-';
}

// Appends `text` escaped; `quote` also escapes '"'.
void AppendEscaped(absl::string_view text, bool quote, std::string* out) {
  for (char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == '\\' || (quote && c == '"')) {
      out->push_back('\\');
      out->push_back(c);
    } else if (u < 0x20 || u > 0x7e) {
      absl::StrAppendFormat(out, "\\x%02x", u);
    } else {
      out->push_back(c);
    }
  }
}

}  // namespace

std::string LogText(absl::string_view text, size_t max_bytes) {
  std::string out;
  AppendEscaped(text.substr(0, max_bytes), /*quote=*/false, &out);
  if (text.size() > max_bytes) absl::StrAppend(&out, "...(", text.size(), " bytes)");
  return out;
}

std::string LogValue(absl::string_view value, size_t max_bytes) {
  bool plain = !value.empty() && value.size() <= max_bytes;
  for (char c : value) plain = plain && IsPlain(c);
  if (plain) return std::string(value);
  const absl::string_view shown = value.substr(0, max_bytes);
  std::string out = "\"";
  AppendEscaped(shown, /*quote=*/true, &out);
  out.push_back('"');
  if (shown.size() < value.size()) absl::StrAppend(&out, "...(", value.size(), " bytes)");
  return out;
}

}  // namespace dcf
