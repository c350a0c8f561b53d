#include "engine/common/file_util.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace dcf {

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (f == nullptr) {
    const int err = errno;
    const std::string what = absl::StrCat("cannot open '", path, "': ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(what);
    if (err == EACCES) return absl::PermissionDeniedError(what);
    return absl::InternalError(what);
  }
  std::string out;
  char buf[1 << 16];
  while (true) {
    const size_t n = std::fread(buf, 1, sizeof(buf), f.get());
    out.append(buf, n);
    if (n < sizeof(buf)) break;
  }
  if (std::ferror(f.get())) {
    // fopen succeeds on a directory; reading it fails with EISDIR.
    return absl::InternalError(absl::StrCat("cannot read '", path, "': ", std::strerror(errno)));
  }
  return out;
}

}  // namespace dcf
