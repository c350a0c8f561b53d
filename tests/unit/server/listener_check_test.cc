#include "server/listener_check.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "gtest/gtest.h"

namespace dcf::server {
namespace {

TEST(ListenerCheckTest, SelfCheckHost) {
  EXPECT_EQ(SelfCheckHost("0.0.0.0"), "127.0.0.1");
  EXPECT_EQ(SelfCheckHost("::"), "::1");
  EXPECT_EQ(SelfCheckHost("[::1]"), "::1");
  EXPECT_EQ(SelfCheckHost("10.1.2.3"), "10.1.2.3");
}

TEST(ListenerCheckTest, ReadsTheAcceptQueueOfTheListener) {
  const char* table =
      "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"
      "   0: 0100007F:C351 00000000:0000 0A 00000000:00000003 00:00000000 00000000     0\n"
      "   1: 0100007F:C351 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0\n"
      "   2: 00000000:2382 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0\n";
  EXPECT_EQ(ListenQueueLength(table, 0xC351), 3);  // 50001
  EXPECT_EQ(ListenQueueLength(table, 0x2382), 0);  // 9090
  EXPECT_EQ(ListenQueueLength(table, 0x9C40), std::nullopt);  // only a connection's port
  EXPECT_EQ(ListenQueueLength("", 80), std::nullopt);
}

// A listener that never accepts fails the probe; one that accepts passes it.
TEST(ListenerCheckTest, ProbeSeesWhetherTheListenerAccepts) {
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(listener, 16), 0);
  socklen_t len = sizeof(a);
  getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  const absl::Status dead = ProbeListener("127.0.0.1", port, absl::Milliseconds(300));
  EXPECT_EQ(dead.code(), absl::StatusCode::kDeadlineExceeded) << dead;
  std::atomic<bool> stop{false};
  std::thread acceptor([&] {
    while (!stop.load()) {
      const int c = accept(listener, nullptr, nullptr);
      if (c >= 0) close(c);
    }
  });
  const absl::Status alive = ProbeListener("127.0.0.1", port, absl::Seconds(30));
  EXPECT_TRUE(alive.ok()) << alive;
  stop.store(true);
  shutdown(listener, SHUT_RDWR);  // wakes the accept
  acceptor.join();
  close(listener);
  EXPECT_EQ(ProbeListener("127.0.0.1", port, absl::Seconds(5)).code(),
            absl::StatusCode::kUnavailable);  // refused: nothing listens any more
}

// Where procfs does not show the listener (gVisor-like runtimes), a completed connect passes:
// before, the probe said Unavailable and the server exited every three intervals.
TEST(ListenerCheckTest, ProbeFallsBackToTheConnectWhereProcfsShowsNoListener) {
  const int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(listener, 16), 0);
  socklen_t len = sizeof(a);
  getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  bool visible = true;
  const absl::Status probe = ProbeListener("127.0.0.1", port, absl::Seconds(5), &visible,
                                           {"/nonexistent/net/tcp", "/dev/null"});
  EXPECT_TRUE(probe.ok()) << probe;
  EXPECT_FALSE(visible);
  // With the real tables the queue shows, and the same listener (which never accepts) fails.
  const absl::Status real = ProbeListener("127.0.0.1", port, absl::Milliseconds(300), &visible);
  EXPECT_EQ(real.code(), absl::StatusCode::kDeadlineExceeded) << real;
  EXPECT_TRUE(visible);
  close(listener);
  EXPECT_EQ(ProbeListener("127.0.0.1", port, absl::Seconds(5), &visible, {"/dev/null"}).code(),
            absl::StatusCode::kUnavailable);  // refused: nothing listens any more
}

}  // namespace
}  // namespace dcf::server
