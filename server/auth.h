// API-key authentication of TextGeneration calls: `authorization: Bearer <key>` metadata.
//
// The key file holds one key per line (blank lines and lines starting with '#' ignored), so
// keys can be rotated by listing old and new ones. Reload() re-reads the file (the server
// does so every --api-key-reload-interval): a rotation takes effect without a restart. At
// startup a line that is not a valid key is an error; on a reload it is skipped and reported
// (Reload), so that a revoked key never outlives a reload; a file that cannot be read or holds
// no valid key leaves the last good keys in force. Keys are compared in constant time and
// never logged.
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
  // NotFound / InvalidArgument (no key in the file, a line that is not a key: with spaces or
  // controls, named by its line number) naming the path.
  static absl::StatusOr<std::unique_ptr<ApiKeyChecker>> FromFile(const std::string& path);
  static absl::StatusOr<std::unique_ptr<ApiKeyChecker>> FromKeys(std::vector<std::string> keys);

  // OK when `metadata` (a call's client metadata) carries a valid bearer key; otherwise
  // Unauthenticated with a message that says what is wrong (never echoing the key).
  absl::Status Check(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const;
  // Same check on the raw value of the authorization header.
  absl::Status CheckHeader(absl::string_view authorization) const;

  // Re-reads the file of FromFile (a leading UTF-8 byte-order mark is ignored). The keys in
  // force become exactly the valid keys of the file: a key removed from it (revoked) stops
  // working even when another line is bad. A line that is not a valid key is skipped and
  // named by its number in `bad_lines` (never by its content): the reload still applies, and
  // the caller reports it as a failure. An error, with the last good keys kept in force, only
  // when the file cannot be read or holds no valid key. FailedPrecondition for a checker made
  // FromKeys.
  struct Reloaded {
    bool changed = false;   // the keys in force changed
    std::string bad_lines;  // empty, or "--api-key-file: '<path>': lines 3, 7 are not a key ..."
  };
  absl::StatusOr<Reloaded> Reload();
  int num_keys() const;

 private:
  using Keys = std::vector<std::string>;
  ApiKeyChecker(std::string path, Keys keys)
      : path_(std::move(path)), keys_(std::make_shared<const Keys>(std::move(keys))) {}
  struct Parsed {
    Keys keys;
    std::vector<int> bad_lines;  // 1-based numbers of lines that are not a valid key
  };
  // NotFound / InvalidArgument when the file cannot be read or holds no valid key.
  static absl::StatusOr<Parsed> ReadKeys(const std::string& path);
  static std::string BadLinesText(const std::vector<int>& lines);
  static absl::Status ValidateKeys(const Keys& keys);
  std::shared_ptr<const Keys> keys() const;

  const std::string path_;  // empty: FromKeys
  mutable absl::Mutex mu_;
  std::shared_ptr<const Keys> keys_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dcf::server
