// Reading a whole file: the one implementation every loader, the server and the CLI share.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace dcf {

// The file's bytes. NotFound when `path` does not exist, PermissionDenied when it cannot be
// opened for that reason, Internal for other open or read errors (e.g. a directory); every
// message names the path and the system's reason. Thread-safe.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace dcf
