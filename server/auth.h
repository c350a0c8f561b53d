// API-key authentication of TextGeneration calls: `authorization: Bearer <key>` metadata.
//
// The key file holds one key per line (blank lines and lines starting with '#' ignored), so
// keys can be rotated by listing old and new ones. Keys are compared in constant time and
// never logged. Thread-safe after construction (immutable).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/string_ref.h"

namespace dcf::server {

class ApiKeyChecker {
 public:
  // NotFound / InvalidArgument (no key in the file) naming the path.
  static absl::StatusOr<ApiKeyChecker> FromFile(const std::string& path);
  static absl::StatusOr<ApiKeyChecker> FromKeys(std::vector<std::string> keys);

  // OK when `metadata` (a call's client metadata) carries a valid bearer key; otherwise
  // Unauthenticated with a message that says what is wrong (never echoing the key).
  absl::Status Check(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const;
  // Same check on the raw value of the authorization header.
  absl::Status CheckHeader(absl::string_view authorization) const;

 private:
  explicit ApiKeyChecker(std::vector<std::string> keys) : keys_(std::move(keys)) {}
  std::vector<std::string> keys_;
};

}  // namespace dcf::server
