// A small HTTP/1.1 server (Boost.Beast over Asio) for the server's plain-HTTP endpoints: the
// Prometheus /metrics port and the OpenAI-compatible front (--http-port, openai_service.h),
// each its own listener with its own limits. It replaced prometheus-cpp's civetweb exposer,
// which crashed the process on any other path and served one request at a time.
//
// What it guarantees, whatever a client sends:
//   - a fixed pool of threads (HttpServerOptions::threads) runs every connection
//     asynchronously: a slow or stalled client holds a socket and a few KiB, never a thread;
//     each connection runs on its own strand, so its handlers never run concurrently;
//   - a new connection's first request (TLS handshake included) must arrive complete within
//     `first_request_timeout`, a keep-alive connection's next one within `idle_timeout`; a
//     whole response must be written within `write_timeout`, and each slice of at most
//     kStreamSliceBytes of a streamed response within `stream_write_timeout` (a minimum rate,
//     not a bound on the stream's length), else the connection is closed;
//   - a body with a Content-Encoding other than identity gets 415 (read as sent), headers
//     beyond `max_header_bytes` 431, bodies beyond `max_body_bytes` 413, chunk
//     framing that does not fit the bounded read buffer 400, anything that is not HTTP/1.x
//     400 (505 for another version), a Transfer-Encoding other than exactly `chunked` 400
//     (`xchunked`) or 501 (`gzip, chunked`), and the connection is closed after each of those;
//   - at most `max_connections` are open at once, at most `max_connections_per_ip` from one
//     address (0: no per-address cap). At a cap the oldest connection that is not in the
//     middle of an exchange (first one that never finished a request, then idle keep-alive
//     ones) is closed to make room; when every one is busy the newcomer gets 503. Each is
//     reported to `on_connection_event` ("evicted", "refused");
//   - a connection reads at most `max_requests_per_second` requests a second (a token bucket
//     of that size; 0: no budget): a client pipelining requests waits, it does not get
//     errors, and other connections are not slowed by it;
//   - paths without a route get 404, a route's other methods 405 with an Allow header; HEAD is
//     served wherever GET is (without the body).
//
// Routes are synchronous (HttpHandler: the answer at once, for cheap handlers) or asynchronous
// (HttpAsyncHandler: the handler returns an HttpBodySource that the connection pulls its
// response from, on the connection's strand, whenever the source's wake function is called
// and no write is in flight; a streamed body is written with chunked transfer-encoding). While
// an asynchronous exchange waits or streams, the connection watches its socket: a client that
// disconnects aborts the source (HttpBodySource::OnAbort) at once.
//
// `admit` runs once a request's headers are in and before its body is read (an API-key check
// refuses a request without buffering its body).
//
// Thread-safety: handlers and sources run on the pool's threads (one connection's on its
// strand); they must not block. Everything on HttpServer may be called from any thread.
// Lifetime: Stop() (or the destructor) closes the listener and every connection and joins the
// threads; no handler runs after it returns, and every source still held is destroyed (a
// source's destructor must release what it holds).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace dcf::server {

struct HttpRequest {
  std::string method;  // "GET", ...
  std::string path;    // the target up to '?', e.g. "/metrics"
  std::string query;   // after '?', undecoded; empty when none
  // Header names lower-cased; repeated headers keep every value.
  std::multimap<std::string, std::string> headers;
  std::string body;
  std::string peer;  // the client's IP address

  // The first value of header `name` (lower case), or null.
  const std::string* Header(const std::string& name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
  std::string body;
};

// What an asynchronous response hands the connection at one pull.
struct HttpPull {
  enum class Kind {
    kWait,        // nothing yet: the source calls its wake function when there is more
    kResponse,    // `response` is the whole answer (only as the first answer of a pull)
    kStreamHead,  // a streamed answer starts: `response` holds status, content type and
                  // headers, and its body is the stream's first bytes
    kData,        // `data`: the stream's next bytes
    kEnd,         // `data`: the stream's last bytes (may be empty); the exchange is over
  };
  Kind kind = Kind::kWait;
  HttpResponse response;
  std::string data;
};

// The producer of one asynchronous response. Every method runs on the connection's strand,
// never two at once; none may block.
class HttpBodySource {
 public:
  virtual ~HttpBodySource() = default;
  // Called once right after the handler returned, and then after each wake while no write is
  // in flight, until it returns kResponse or kEnd.
  virtual HttpPull Pull() = 0;
  // Called after a wake while a write is in flight (the client reads slower than the source
  // produces): false ends the exchange now (the connection is closed, OnAbort follows).
  virtual bool KeepWaiting() { return true; }
  // The exchange ended before the source's last bytes were written: the client closed the
  // connection, a write stalled, the source gave up (KeepWaiting) or the server stopped
  // (then from Stop(), without a strand). Called at most once; Pull is not called after it.
  virtual void OnAbort(absl::string_view reason) {}
};

// Thread-safe and cheap (an atomic flag, and one post to the connection's strand while none
// is pending); does nothing once the exchange is over. May be called from any thread.
using HttpWake = std::function<void()>;

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;
using HttpAsyncHandler =
    std::function<std::shared_ptr<HttpBodySource>(HttpRequest request, HttpWake wake)>;

// Method + exact path -> handler. Immutable once the server starts.
class HttpRouter {
 public:
  void Add(std::string method, std::string path, HttpHandler handler);
  void AddAsync(std::string method, std::string path, HttpAsyncHandler handler);

  struct Handlers {
    HttpHandler sync;        // one of the two is set
    HttpAsyncHandler async;
  };
  // The route of `request`, or null with `*refusal` set: 404 (no such path) or 405 (no such
  // method on that path, with Allow).
  const Handlers* Find(const HttpRequest& request, HttpResponse* refusal) const;
  // Runs a synchronous route (an asynchronous one answers 500): for tests.
  HttpResponse Route(const HttpRequest& request) const;

 private:
  std::map<std::string, std::map<std::string, Handlers>> routes_;  // path -> method -> h
};

struct HttpServerOptions {
  std::string host = "127.0.0.1";  // an IPv4/IPv6 literal or a name resolving to one
  int port = 0;                     // 0: any free port (see HttpServer::port())
  int threads = 2;
  int max_connections = 256;
  int max_connections_per_ip = 0;   // 0: no per-address cap
  size_t max_header_bytes = 8 << 10;
  size_t max_body_bytes = 64 << 10;
  absl::Duration first_request_timeout = absl::Seconds(5);  // from accept (and handshake)
  absl::Duration idle_timeout = absl::Seconds(10);  // keep-alive: until the next full request
  absl::Duration write_timeout = absl::Seconds(10);  // a whole response
  absl::Duration stream_write_timeout = absl::Seconds(30);  // one slice of a streamed one
  double max_requests_per_second = 0;  // per connection; 0: no budget
  // TLS: the PEM file with the private key and certificate chain, and an optional CA bundle
  // that client certificates must chain to (mutual TLS). Empty: plaintext.
  std::string tls_identity_file;
  std::string tls_client_ca_file;
  // Runs once a request's headers are read, before its body: a response refuses the request
  // (the connection is then closed, its body unread).
  std::function<std::optional<HttpResponse>(const HttpRequest& head)> admit;
  // The body of the layer's own refusals (404, 405, 413, 431, 400, 503 while draining...):
  // plain text "<message>\n" when unset; the OpenAI front answers its JSON error object.
  // Extra headers of the refusal (405's Allow) are kept.
  std::function<HttpResponse(int status, absl::string_view message)> error_response;
  // While the server drains, a request that passes the layer's own checks (framing, coding,
  // target) and `admit` is answered by this instead of its route, and the connection closed:
  // the OpenAI front counts a refused generation request and answers /health as the route
  // does when not serving. Unset: error_response's 503.
  std::function<HttpResponse(const HttpRequest& head)> draining_response;
  // "evicted" (a connection closed to make room at a cap) or "refused" (503 at a cap);
  // called on the listener's strand.
  std::function<void(absl::string_view event)> on_connection_event;
};

// Streamed bodies are written in slices of at most this many bytes, each under
// stream_write_timeout.
inline constexpr size_t kStreamSliceBytes = 16 << 10;

class HttpServer {
 public:
  // Listens and starts serving. Unavailable naming the address when it cannot listen;
  // InvalidArgument when the TLS files do not load.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(HttpServerOptions options,
                                                           HttpRouter router);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  // Connections open now (for tests and logs).
  int open_connections() const;
  // Re-reads the TLS files of the options (after the server's TLS reload replaced them):
  // new connections use the new material, open ones keep theirs. An error keeps the old.
  absl::Status ReloadTls();
  // From now on every new request is answered 503 "server is shutting down" and its
  // connection closed; idle connections are closed now, busy ones after their exchange.
  void StartDraining();
  // After StartDraining: waits until no connection is still in an exchange (every response
  // begun written out, its connection then closing), or `deadline`; false when one still
  // was. A stream's last event reaches its connection before the bytes reach the client:
  // Stop() right away would cut what a slow reader has not taken yet.
  bool AwaitExchanges(absl::Time deadline) const;
  void Stop();

  class Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dcf::server
