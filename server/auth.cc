#include "server/auth.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_split.h"
#include "engine/common/file_util.h"

namespace dcf::server {
namespace {

// Compares without an early exit so the time does not depend on where the first mismatch is.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = a.size() < b.size() ? a.size() : b.size();
  for (size_t i = 0; i < n; ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

absl::StatusOr<ApiKeyChecker::Parsed> ApiKeyChecker::ReadKeys(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("--api-key-file: ", text.status().message()));
  }
  absl::string_view rest = *text;
  absl::ConsumePrefix(&rest, "\xEF\xBB\xBF");  // a UTF-8 byte-order mark, as editors write it
  Parsed parsed;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(rest, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    Keys one = {std::string(line)};
    if (ValidateKeys(one).ok()) {
      parsed.keys.push_back(std::move(one[0]));
    } else {
      parsed.bad_lines.push_back(number);
    }
  }
  if (parsed.keys.empty()) {
    std::string why = absl::StrCat("--api-key-file: '", path, "' contains no valid key");
    if (!parsed.bad_lines.empty()) absl::StrAppend(&why, " (", BadLinesText(parsed.bad_lines), ")");
    return absl::InvalidArgumentError(why);
  }
  return parsed;
}

std::string ApiKeyChecker::BadLinesText(const std::vector<int>& lines) {
  return absl::StrCat(lines.size() == 1 ? "line " : "lines ", absl::StrJoin(lines, ", "),
                      lines.size() == 1 ? " is" : " are",
                      " not a key (keys are printable ASCII without spaces)");
}

absl::Status ApiKeyChecker::ValidateKeys(const Keys& keys) {
  for (const std::string& key : keys) {
    if (key.empty()) return absl::InvalidArgumentError("api key: empty key");
    for (char c : key) {
      if (c <= ' ' || c > '~') {
        return absl::InvalidArgumentError("api key: keys must be printable ASCII without spaces");
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ApiKeyChecker>> ApiKeyChecker::FromFile(const std::string& path) {
  absl::StatusOr<Parsed> parsed = ReadKeys(path);
  if (!parsed.ok()) return parsed.status();
  if (!parsed->bad_lines.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--api-key-file: '", path, "': ", BadLinesText(parsed->bad_lines)));
  }
  return std::unique_ptr<ApiKeyChecker>(new ApiKeyChecker(path, std::move(parsed->keys)));
}

absl::StatusOr<std::unique_ptr<ApiKeyChecker>> ApiKeyChecker::FromKeys(Keys keys) {
  if (absl::Status s = ValidateKeys(keys); !s.ok()) return s;
  return std::unique_ptr<ApiKeyChecker>(new ApiKeyChecker("", std::move(keys)));
}

absl::StatusOr<ApiKeyChecker::Reloaded> ApiKeyChecker::Reload() {
  if (path_.empty()) return absl::FailedPreconditionError("api keys were not read from a file");
  absl::StatusOr<Parsed> parsed = ReadKeys(path_);
  if (!parsed.ok()) return parsed.status();
  Reloaded result;
  if (!parsed->bad_lines.empty()) {
    result.bad_lines = absl::StrCat("--api-key-file: '", path_, "': ",
                                    BadLinesText(parsed->bad_lines), ", skipped");
  }
  absl::MutexLock lock(&mu_);
  result.changed = parsed->keys != *keys_;
  if (result.changed) keys_ = std::make_shared<const Keys>(std::move(parsed->keys));
  return result;
}

std::shared_ptr<const ApiKeyChecker::Keys> ApiKeyChecker::keys() const {
  absl::MutexLock lock(&mu_);
  return keys_;
}

int ApiKeyChecker::num_keys() const { return static_cast<int>(keys()->size()); }

absl::Status ApiKeyChecker::Check(
    const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const {
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return absl::UnauthenticatedError("missing 'authorization: Bearer <api key>' metadata");
  }
  return CheckHeader(absl::string_view(it->second.data(), it->second.size()));
}

absl::Status ApiKeyChecker::CheckHeader(absl::string_view authorization) const {
  authorization = absl::StripAsciiWhitespace(authorization);
  constexpr absl::string_view kBearer = "bearer ";
  if (authorization.size() < kBearer.size() ||
      !absl::EqualsIgnoreCase(authorization.substr(0, kBearer.size()), kBearer)) {
    return absl::UnauthenticatedError("authorization metadata must be 'Bearer <api key>'");
  }
  absl::string_view presented = absl::StripAsciiWhitespace(authorization.substr(kBearer.size()));
  const std::shared_ptr<const Keys> keys = this->keys();
  bool ok = false;
  for (const std::string& key : *keys) ok |= ConstantTimeEquals(presented, key);
  if (!ok) return absl::UnauthenticatedError("invalid api key");
  return absl::OkStatus();
}

}  // namespace dcf::server
