#include "server/listener_check.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/common/file_util.h"

namespace dcf::server {
namespace {

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

// The accept queue of the listener on `port` in any table; nullopt when none has one.
std::optional<int> QueueNow(int port, const std::vector<std::string>& tables) {
  std::optional<int> total;
  for (const std::string& table : tables) {
    absl::StatusOr<std::string> text = ReadFileToString(table);
    if (!text.ok()) continue;
    if (std::optional<int> q = ListenQueueLength(*text, port); q.has_value()) {
      total = total.value_or(0) + *q;
    }
  }
  return total;
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

std::optional<int> ListenQueueLength(absl::string_view proc_net_tcp, int port) {
  // "  sl  local_address rem_address   st tx_queue:rx_queue ..."
  //  "   0: 0100007F:C351 00000000:0000 0A 00000000:00000002 ..."
  for (absl::string_view line : absl::StrSplit(proc_net_tcp, '\n')) {
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 5 || f[3] != "0A") continue;  // 0A: TCP_LISTEN
    const size_t colon = f[1].rfind(':');
    if (colon == absl::string_view::npos) continue;
    if (std::strtol(std::string(f[1].substr(colon + 1)).c_str(), nullptr, 16) != port) continue;
    const size_t q = f[4].find(':');
    if (q == absl::string_view::npos) continue;
    return static_cast<int>(std::strtol(std::string(f[4].substr(q + 1)).c_str(), nullptr, 16));
  }
  return std::nullopt;
}

const std::vector<std::string>& ProcNetTcpTables() {
  static const auto* const tables =
      new std::vector<std::string>{"/proc/self/net/tcp", "/proc/self/net/tcp6"};
  return *tables;
}

absl::Status ProbeListener(const std::string& host, int port, absl::Duration timeout,
                           bool* queue_visible, const std::vector<std::string>& tables) {
  if (queue_visible != nullptr) *queue_visible = true;
  const absl::Time deadline = absl::Now() + timeout;
  addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return absl::UnavailableError(absl::StrCat("resolve ", host, ": ", gai_strerror(rc)));
  }
  sockaddr_storage address;
  const socklen_t address_len = found->ai_addrlen;
  const int family = found->ai_family;
  std::memcpy(&address, found->ai_addr, found->ai_addrlen);
  freeaddrinfo(found);
  Fd fd(socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&address), address_len) != 0 &&
      errno != EINPROGRESS) {
    return absl::UnavailableError(absl::StrCat("connect: ", std::strerror(errno)));
  }
  pollfd p = {fd.get(), POLLOUT, 0};
  if (poll(&p, 1, PollMs(deadline)) <= 0) {
    return absl::DeadlineExceededError("connect did not complete (the accept queue is full)");
  }
  int error = 0;
  socklen_t len = sizeof(error);
  getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &len);
  if (error != 0) return absl::UnavailableError(absl::StrCat("connect: ", std::strerror(error)));
  // Connected: the kernel queued the connection; a live listener takes it off the queue.
  int waiting = 0;
  while (true) {
    const std::optional<int> queue = QueueNow(port, tables);
    if (!queue.has_value()) {
      // Connected, yet no listener in procfs: a runtime whose procfs does not show this
      // network namespace (gVisor and the like). The completed connect is all there is to go
      // on: a listener that stopped accepting fails it only once its queue is full.
      if (queue_visible != nullptr) *queue_visible = false;
      return absl::OkStatus();
    }
    if (*queue == 0) return absl::OkStatus();
    waiting = *queue;
    if (absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("connected, but the listener accepted nothing within ",
                   absl::FormatDuration(timeout), " (", waiting, " connection(s) in its queue)"));
}

}  // namespace dcf::server
