#include "engine/common/file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdint>
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

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused just below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string what = absl::StrCat("cannot open '", path, "': ", std::strerror(err));
    if (err == ENOENT) return absl::NotFoundError(what);
    if (err == EACCES) return absl::PermissionDeniedError(what);
    return absl::InternalError(what);
  }
  std::unique_ptr<int, void (*)(int*)> closer(new int(fd), [](int* f) {
    ::close(*f);
    delete f;
  });
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::InternalError(absl::StrCat("cannot stat '", path, "': ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a regular file"));
  }
  const std::string too_big =
      absl::StrCat("'", path, "' is larger than ", max_bytes, " bytes, the limit for this file");
  if (static_cast<uint64_t>(st.st_size) > max_bytes) return absl::InvalidArgumentError(too_big);
  std::string out;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::InternalError(absl::StrCat("cannot read '", path, "': ", std::strerror(errno)));
    }
    if (n == 0) break;
    if (out.size() + static_cast<size_t>(n) > max_bytes) return absl::InvalidArgumentError(too_big);
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

}  // namespace dcf
