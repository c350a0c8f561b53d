// A small HTTP/1.1 server (Boost.Beast over Asio) for the server's plain-HTTP endpoints: today
// the Prometheus /metrics port. It replaces prometheus-cpp's civetweb exposer, which crashed
// the process on any other path (a stack overflow formatting its 404) and served one request
// at a time, so one slow client blinded every scrape.
//
// What it guarantees, whatever a client sends:
//   - a fixed pool of threads (HttpServerOptions::threads) runs every connection
//     asynchronously: a slow or stalled client holds a socket and a few KiB, never a thread;
//   - a request's headers (request line included) must arrive within `request_timeout` of the
//     connection becoming idle, and each response be written within `write_timeout`, else the
//     connection is closed (slowloris, drip-fed headers, never-reading clients);
//   - headers beyond `max_header_bytes` get 431, bodies beyond `max_body_bytes` 413, anything
//     that is not HTTP/1.x 400, and the connection is closed after each of those;
//   - at most `max_connections` are open at once; one more is answered 503 and closed;
//   - paths without a route get 404, a route's other methods 405 with an Allow header; HEAD is
//     served wherever GET is (without the body).
//
// Routing is the seam for later endpoints (the OpenAI-compatible front of issue 18 will add
// routes and a streaming response type beside HttpResponse); the listener, timeouts and limits
// stay the same.
//
// Thread-safety: handlers run on the pool's threads, several at once; they must be
// thread-safe and must not block for long (a handler holds its thread while it runs).
// Lifetime: Stop() (or the destructor) closes the listener and every connection and joins the
// threads; no handler runs after it returns.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dcf::server {

struct HttpRequest {
  std::string method;  // "GET", ...
  std::string path;    // the target up to '?', e.g. "/metrics"
  std::string query;   // after '?', undecoded; empty when none
  // Header names lower-cased; repeated headers keep every value.
  std::multimap<std::string, std::string> headers;
  std::string body;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
  std::string body;
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

// Method + exact path -> handler. Immutable once the server starts.
class HttpRouter {
 public:
  void Add(std::string method, std::string path, HttpHandler handler);
  // The route's response, 404 (no such path) or 405 (no such method on that path).
  HttpResponse Route(const HttpRequest& request) const;

 private:
  std::map<std::string, std::map<std::string, HttpHandler>> routes_;  // path -> method -> h
};

struct HttpServerOptions {
  std::string host = "127.0.0.1";  // an IPv4/IPv6 literal or a name resolving to one
  int port = 0;                     // 0: any free port (see HttpServer::port())
  int threads = 2;
  int max_connections = 256;
  size_t max_header_bytes = 8 << 10;
  size_t max_body_bytes = 64 << 10;
  absl::Duration request_timeout = absl::Seconds(10);  // idle or partial request -> closed
  absl::Duration write_timeout = absl::Seconds(10);
};

class HttpServer {
 public:
  // Listens and starts serving. Unavailable naming the address when it cannot listen.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(HttpServerOptions options,
                                                           HttpRouter router);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  // Connections open now (for tests and logs).
  int open_connections() const;
  void Stop();

  class Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dcf::server
