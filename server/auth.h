// API-key authentication of TextGeneration calls: `authorization: Bearer <key>` metadata.
//
// The key file holds one key per line (blank lines and lines starting with '#' ignored), so
// keys can be rotated by listing old and new ones. Reload() re-reads the file (the server
// does so every --api-key-reload-interval): a rotation takes effect without a restart, and a
// file that cannot be read or holds no valid key leaves the last good keys in force. Keys are
// compared in constant time and never logged.
//
// Thread-safety: every method may be called from any thread; a Check concurrent with a Reload
// sees either the old keys or the new ones.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/string_ref.h"

namespace dcf::server {

class ApiKeyChecker {
 public:
  // NotFound / InvalidArgument (no key in the file, a key with spaces or controls) naming
  // the path.
  static absl::StatusOr<std::unique_ptr<ApiKeyChecker>> FromFile(const std::string& path);
  static absl::StatusOr<std::unique_ptr<ApiKeyChecker>> FromKeys(std::vector<std::string> keys);

  // OK when `metadata` (a call's client metadata) carries a valid bearer key; otherwise
  // Unauthenticated with a message that says what is wrong (never echoing the key).
  absl::Status Check(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const;
  // Same check on the raw value of the authorization header.
  absl::Status CheckHeader(absl::string_view authorization) const;

  // Re-reads the file of FromFile. True when the keys changed, false when they are the same;
  // an error (the file's, as FromFile words it) when the last good keys stay in force.
  // FailedPrecondition for a checker made FromKeys.
  absl::StatusOr<bool> Reload();
  int num_keys() const;

 private:
  using Keys = std::vector<std::string>;
  ApiKeyChecker(std::string path, Keys keys)
      : path_(std::move(path)), keys_(std::make_shared<const Keys>(std::move(keys))) {}
  static absl::StatusOr<Keys> ReadKeys(const std::string& path);
  static absl::Status ValidateKeys(const Keys& keys);
  std::shared_ptr<const Keys> keys() const;

  const std::string path_;  // empty: FromKeys
  mutable absl::Mutex mu_;
  std::shared_ptr<const Keys> keys_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dcf::server
