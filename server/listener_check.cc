#include "server/listener_check.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace dcf::server {
namespace {

// "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" then a SETTINGS frame with no settings.
constexpr char kPreface[] =
    "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    "\x00\x00\x00\x04\x00\x00\x00\x00\x00";
constexpr size_t kPrefaceBytes = sizeof(kPreface) - 1;

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

int PollMs(absl::Time deadline) {
  const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  return static_cast<int>(ms < 0 ? 0 : (ms > 60'000 ? 60'000 : ms));
}

}  // namespace

std::string SelfCheckHost(const std::string& host) {
  if (host == "0.0.0.0" || host.empty()) return "127.0.0.1";
  if (host == "::" || host == "[::]") return "::1";
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

absl::Status ProbeListener(const std::string& host, int port, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat("resolve ", host, ": ", gai_strerror(rc)));
  }
  const addrinfo address = *found;
  sockaddr_storage storage;
  std::memcpy(&storage, found->ai_addr, found->ai_addrlen);
  freeaddrinfo(found);
  Fd fd(socket(address.ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) {
    return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  }
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&storage), address.ai_addrlen) != 0 &&
      errno != EINPROGRESS) {
    return absl::UnavailableError(absl::StrCat("connect: ", std::strerror(errno)));
  }
  pollfd p = {fd.get(), POLLOUT, 0};
  if (poll(&p, 1, PollMs(deadline)) <= 0) {
    return absl::DeadlineExceededError("connect did not complete");
  }
  int error = 0;
  socklen_t len = sizeof(error);
  getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &len);
  if (error != 0) return absl::UnavailableError(absl::StrCat("connect: ", std::strerror(error)));
  // Loopback: the preface fits in the socket buffer at once.
  if (send(fd.get(), kPreface, kPrefaceBytes, MSG_NOSIGNAL) != static_cast<ssize_t>(kPrefaceBytes)) {
    return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
  }
  while (true) {
    p = {fd.get(), POLLIN, 0};
    const int ready = poll(&p, 1, PollMs(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      return absl::DeadlineExceededError(absl::StrCat(
          "connected, but nothing answered within ", absl::FormatDuration(timeout)));
    }
    char buf[64];
    const ssize_t n = recv(fd.get(), buf, sizeof(buf), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    return absl::OkStatus();  // bytes, an orderly close (0) or a reset: the listener is alive
  }
}

}  // namespace dcf::server
