// Reading a whole file: the one implementation every loader, the server and the CLI share.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace dcf {

// The file's bytes. NotFound when `path` does not exist, PermissionDenied when it cannot be
// opened for that reason, Internal for other open or read errors (e.g. a directory); every
// message names the path and the system's reason. Thread-safe.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// The bytes of a regular file of at most `max_bytes`, for small inputs an operator names (a
// chat template, a JSON config): InvalidArgument, before reading anything, for what is not a
// regular file (a FIFO would block, /dev/zero never end, a directory) and for a file over
// `max_bytes` (also one that grows past it while read); otherwise as ReadFileToString.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes);

}  // namespace dcf
