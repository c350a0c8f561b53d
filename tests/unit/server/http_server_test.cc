#include "server/http_server.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace dcf::server {
namespace {

HttpRouter MetricsRouter(std::atomic<int>* calls) {
  HttpRouter router;
  router.Add("GET", "/metrics", [calls](const HttpRequest& r) {
    ++*calls;
    HttpResponse response;
    response.body = "up 1\n";
    if (!r.query.empty()) response.body += "# query " + r.query + "\n";
    return response;
  });
  return router;
}

HttpRequest Request(std::string method, std::string path) {
  HttpRequest r;
  r.method = std::move(method);
  r.path = std::move(path);
  return r;
}

TEST(HttpRouterTest, RoutesExactPathsAndMethods) {
  std::atomic<int> calls{0};
  const HttpRouter router = MetricsRouter(&calls);
  EXPECT_EQ(router.Route(Request("GET", "/metrics")).status, 200);
  EXPECT_EQ(router.Route(Request("HEAD", "/metrics")).status, 200);
  EXPECT_EQ(calls.load(), 2);
  for (const char* path : {"/", "/metrics/", "/Metrics", "/favicon.ico", ""}) {
    EXPECT_EQ(router.Route(Request("GET", path)).status, 404) << path;
  }
  const HttpResponse post = router.Route(Request("POST", "/metrics"));
  EXPECT_EQ(post.status, 405);
  ASSERT_EQ(post.headers.size(), 1u);
  EXPECT_EQ(post.headers[0].first, "Allow");
  EXPECT_EQ(post.headers[0].second, "GET, HEAD");
  EXPECT_EQ(calls.load(), 2);
}

// Sends `raw` on a fresh connection and returns all the server answered until it closed.
std::string Exchange(int port, const std::string& raw) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(send(fd, raw.data(), raw.size(), MSG_NOSIGNAL), static_cast<ssize_t>(raw.size()));
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

TEST(HttpServerTest, ServesRoutesAndRefusesTheRest) {
  std::atomic<int> calls{0};
  HttpServerOptions options;
  options.request_timeout = absl::Seconds(2);
  auto server = HttpServer::Start(options, MetricsRouter(&calls));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);
  const std::string ok =
      Exchange(port, "GET /metrics?a=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(ok, "HTTP/1.1 200 OK\r\n")) << ok;
  EXPECT_TRUE(absl::EndsWith(ok, "up 1\n# query a=1\n")) << ok;
  // Keep-alive: two requests on one connection, then the close.
  const std::string two = Exchange(
      port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\n"
            "Connection: close\r\n\r\n");
  EXPECT_TRUE(absl::StrContains(two, "HTTP/1.1 200 OK")) << two;
  EXPECT_TRUE(absl::StrContains(two, "HTTP/1.1 404 Not Found")) << two;
  EXPECT_TRUE(absl::StartsWith(Exchange(port, "NONSENSE\r\n\r\n"), "HTTP/1.1 400")) << "garbage";
  EXPECT_TRUE(absl::StartsWith(
      Exchange(port, "GET /metrics HTTP/1.1\r\nX: " + std::string(20000, 'a') + "\r\n\r\n"),
      "HTTP/1.1 431"));
  EXPECT_TRUE(absl::StartsWith(
      Exchange(port, "POST /metrics HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n"),
      "HTTP/1.1 413"));
  // A request that never completes is closed at the request deadline, unanswered.
  const absl::Time start = absl::Now();
  EXPECT_EQ(Exchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n"), "");
  EXPECT_GE(absl::Now() - start, absl::Seconds(1.5));
  EXPECT_EQ(calls.load(), 2);
  (*server)->Stop();
  EXPECT_EQ((*server)->open_connections(), 0);
}

// Peak resident memory of this process (VmHWM), in KiB.
int64_t PeakRssKib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

// Sends `head` and then `filler` bytes (as fast as the server takes them) while reading the
// answer on this thread; returns what the server answered until it closed.
std::string SendFlood(int port, const std::string& head, size_t filler) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  std::thread sender([fd, head, filler] {
    if (send(fd, head.data(), head.size(), MSG_NOSIGNAL) < 0) return;
    const std::string block(64 << 10, 'a');
    for (size_t sent = 0; sent < filler; sent += block.size()) {
      if (send(fd, block.data(), block.size(), MSG_NOSIGNAL) < 0) return;  // closed: done
    }
  });
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) out.append(buf, static_cast<size_t>(n));
  shutdown(fd, SHUT_RDWR);  // ends a sender still blocked in send()
  sender.join();
  close(fd);
  return out;
}

// Beast applies neither header_limit nor body_limit to chunk extensions and trailers: before
// the read buffer was bounded, 1000 MiB of chunk extension on one connection took the server
// from 132 MiB to 1,185 MiB of RSS (the probe-1 review, finding 1).
TEST(HttpServerTest, ChunkExtensionsAndTrailersAreBounded) {
  std::atomic<int> calls{0};
  HttpServerOptions options;
  options.request_timeout = absl::Seconds(5);
  auto server = HttpServer::Start(options, MetricsRouter(&calls));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  const int64_t peak_before = PeakRssKib();
  const std::string chunked =
      "POST /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  // 10 MiB of one chunk's extension.
  const std::string extension = SendFlood(port, chunked + "1;", 10 << 20);
  EXPECT_TRUE(absl::StartsWith(extension, "HTTP/1.1 400")) << extension.substr(0, 200);
  // 10 MiB of one trailer field.
  const std::string trailer = SendFlood(port, chunked + "1\r\na\r\n0\r\nX-Trailer: ", 10 << 20);
  EXPECT_TRUE(absl::StartsWith(trailer, "HTTP/1.1 4")) << trailer.substr(0, 200);
  // The read buffer is bounded by headers + body + 4 KiB (~76 KiB here); unbounded, it grew
  // past the 10 MiB sent.
  const int64_t peak_after = PeakRssKib();
  EXPECT_LT(peak_after - peak_before, 4 << 10) << "KiB of peak RSS grew";
  EXPECT_EQ(calls.load(), 0);
  (*server)->Stop();
}

TEST(HttpServerTest, ConnectionsPastTheCapGet503) {
  std::atomic<int> calls{0};
  HttpServerOptions options;
  options.max_connections = 2;
  auto server = HttpServer::Start(options, MetricsRouter(&calls));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  // Two idle connections take the cap.
  int idle[2];
  for (int& fd : idle) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  }
  for (int i = 0; i < 200 && (*server)->open_connections() < 2; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_TRUE(absl::StartsWith(Exchange(port, "GET /metrics HTTP/1.1\r\n\r\n"), "HTTP/1.1 503"));
  for (int fd : idle) close(fd);
}

TEST(HttpServerTest, ATakenPortIsAnError) {
  std::atomic<int> calls{0};
  auto first = HttpServer::Start(HttpServerOptions(), MetricsRouter(&calls));
  ASSERT_TRUE(first.ok());
  HttpServerOptions same;
  same.port = (*first)->port();
  auto second = HttpServer::Start(same, MetricsRouter(&calls));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(second.status().message(), "cannot listen")) << second.status();
}

}  // namespace
}  // namespace dcf::server
