#include "server/auth.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
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

absl::StatusOr<ApiKeyChecker::Keys> ApiKeyChecker::ReadKeys(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("--api-key-file: ", text.status().message()));
  }
  Keys keys;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    keys.emplace_back(line);
  }
  if (keys.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--api-key-file: '", path, "' contains no key"));
  }
  if (absl::Status s = ValidateKeys(keys); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--api-key-file: '", path, "': ", s.message()));
  }
  return keys;
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
  absl::StatusOr<Keys> keys = ReadKeys(path);
  if (!keys.ok()) return keys.status();
  return std::unique_ptr<ApiKeyChecker>(new ApiKeyChecker(path, *std::move(keys)));
}

absl::StatusOr<std::unique_ptr<ApiKeyChecker>> ApiKeyChecker::FromKeys(Keys keys) {
  if (absl::Status s = ValidateKeys(keys); !s.ok()) return s;
  return std::unique_ptr<ApiKeyChecker>(new ApiKeyChecker("", std::move(keys)));
}

absl::StatusOr<bool> ApiKeyChecker::Reload() {
  if (path_.empty()) return absl::FailedPreconditionError("api keys were not read from a file");
  absl::StatusOr<Keys> keys = ReadKeys(path_);
  if (!keys.ok()) return keys.status();
  absl::MutexLock lock(&mu_);
  if (*keys == *keys_) return false;
  keys_ = std::make_shared<const Keys>(*std::move(keys));
  return true;
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
