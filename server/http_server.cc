#include "server/http_server.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "boost/asio/dispatch.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/strand.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "engine/common/logging.h"

namespace dcf::server {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

// Framing beyond headers and body that a request may carry (chunk sizes, CRLFs, short chunk
// extensions and trailers).
constexpr size_t kReadBufferSlack = 4 << 10;

std::chrono::steady_clock::duration ToChrono(absl::Duration d) {
  return std::chrono::nanoseconds(absl::ToInt64Nanoseconds(d));
}

HttpResponse Plain(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  r.body.push_back('\n');
  return r;
}

// The read buffer holds at most a request's headers, its body and some framing: Beast's parser
// bounds neither chunk extensions nor trailers (header_limit and body_limit do not cover
// them), so without this bound one connection could grow the buffer until the process ran
// out of memory.
size_t ReadBufferLimit(const HttpServerOptions& o) {
  return o.max_header_bytes + o.max_body_bytes + kReadBufferSlack;
}

bool IsHttpParseError(const beast::error_code& ec) {
  return &ec.category() == &http::make_error_code(http::error::bad_target).category();
}

// After accept() fails (out of file descriptors, say), the next try waits this long instead
// of spinning; the listener never gives up (gRPC 1.51's does: docs/API.md, "Security").
constexpr auto kAcceptRetryDelay = std::chrono::milliseconds(100);

// A closing connection reads (and drops) at most this much, for at most this long.
constexpr size_t kLingerBytes = 256 << 10;
constexpr auto kLingerTime = std::chrono::seconds(1);

}  // namespace

void HttpRouter::Add(std::string method, std::string path, HttpHandler handler) {
  routes_[std::move(path)][std::move(method)] = std::move(handler);
}

HttpResponse HttpRouter::Route(const HttpRequest& request) const {
  auto path = routes_.find(request.path);
  if (path == routes_.end()) return Plain(404, "not found");
  const std::map<std::string, HttpHandler>& methods = path->second;
  auto it = methods.find(request.method);
  if (it == methods.end() && request.method == "HEAD") it = methods.find("GET");
  if (it != methods.end()) return it->second(request);
  std::vector<std::string> allowed;
  for (const auto& [method, handler] : methods) {
    allowed.push_back(method);
    if (method == "GET") allowed.push_back("HEAD");
  }
  std::sort(allowed.begin(), allowed.end());
  HttpResponse r = Plain(405, "method not allowed");
  r.headers.emplace_back("Allow", absl::StrJoin(allowed, ", "));
  return r;
}

class HttpServer::Impl {
 public:
  Impl(HttpServerOptions options, HttpRouter router)
      : options_(std::move(options)),
        router_(std::move(router)),
        ioc_(std::make_unique<net::io_context>(std::max(1, options_.threads))),
        acceptor_(std::make_unique<tcp::acceptor>(net::make_strand(*ioc_))),
        retry_timer_(std::make_unique<net::steady_timer>(acceptor_->get_executor())) {}

  ~Impl() { Stop(); }

  absl::Status Listen() {
    beast::error_code ec;
    tcp::resolver resolver(*ioc_);
    auto endpoints = resolver.resolve(options_.host, std::to_string(options_.port),
                                      tcp::resolver::passive | tcp::resolver::numeric_service, ec);
    if (ec || endpoints.empty()) {
      return absl::UnavailableError(absl::StrCat("cannot resolve '", options_.host, "': ",
                                                 ec ? ec.message() : "no address"));
    }
    const tcp::endpoint endpoint = endpoints.begin()->endpoint();
    acceptor_->open(endpoint.protocol(), ec);
    if (!ec) acceptor_->set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_->bind(endpoint, ec);
    if (!ec) acceptor_->listen(net::socket_base::max_listen_connections, ec);
    if (ec) return absl::UnavailableError(absl::StrCat("cannot listen: ", ec.message()));
    port_ = acceptor_->local_endpoint().port();
    Accept();
    net::io_context* ioc = ioc_.get();
    for (int i = 0; i < std::max(1, options_.threads); ++i) {
      threads_.emplace_back([ioc] { ioc->run(); });
    }
    return absl::OkStatus();
  }

  void Stop() {
    if (stopped_.exchange(true)) return;
    ioc_->stop();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
    // No thread runs handlers any more: close the listener, then destroy the pending
    // operations, and with them every connection (they only touch open_ and the options).
    retry_timer_.reset();
    acceptor_.reset();
    ioc_.reset();
  }

  int port() const { return port_; }
  int open_connections() const { return open_.load(); }
  const HttpServerOptions& options() const { return options_; }
  const HttpRouter& router() const { return router_; }
  std::atomic<int>& open() { return open_; }

 private:
  void Accept() {
    acceptor_->async_accept(net::make_strand(*ioc_), [this](beast::error_code ec, tcp::socket s) {
      OnAccept(ec, std::move(s));
    });
  }
  void OnAccept(beast::error_code ec, tcp::socket socket);

  const HttpServerOptions options_;
  const HttpRouter router_;
  std::atomic<int> open_{0};
  std::atomic<bool> stopped_{false};
  int port_ = 0;
  // Destroyed before the members above, which the sessions pending in it use (Stop()).
  std::unique_ptr<net::io_context> ioc_;
  std::unique_ptr<tcp::acceptor> acceptor_;
  std::unique_ptr<net::steady_timer> retry_timer_;
  std::vector<std::thread> threads_;
};

namespace {

// One connection: read a request, answer it, repeat while keep-alive; every step under a
// deadline. Owned by the pending operation's handler (shared_from_this).
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, HttpServer::Impl* server)
      : stream_(std::move(socket)),
        server_(server),
        buffer_(ReadBufferLimit(server->options())) {
    server_->open().fetch_add(1);
  }
  ~Session() { server_->open().fetch_sub(1); }

  void Run() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->Read(); });
  }

  // Answers 503 and closes (too many connections).
  void Refuse() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
      self->Reply(Plain(503, "too many connections"), 11, /*head=*/false, /*keep_alive=*/false);
    });
  }

 private:
  void Read() {
    const HttpServerOptions& o = server_->options();
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(std::min<size_t>(o.max_header_bytes, UINT32_MAX)));
    parser_->body_limit(o.max_body_bytes);
    // One deadline for the idle wait and the whole request: a drip-fed request cannot extend
    // it by sending a byte now and then.
    stream_.expires_after(ToChrono(o.request_timeout));
    http::async_read(stream_, buffer_, *parser_,
                     beast::bind_front_handler(&Session::OnRead, shared_from_this()));
  }

  void OnRead(beast::error_code ec, size_t /*bytes*/) {
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == http::error::partial_message) {
      return Close();
    }
    if (ec == http::error::header_limit) {
      return Reply(Plain(431, "request header fields too large"), 11, false, false);
    }
    if (ec == http::error::body_limit) {
      return Reply(Plain(413, "payload too large"), 11, false, false);
    }
    if (ec == http::error::buffer_overflow) {
      // Chunk extensions or trailers past the read buffer's bound: Beast applies neither the
      // header nor the body limit to them.
      return Reply(Plain(400, "bad request: the request's framing does not fit in the read "
                              "buffer (chunk extensions or trailers too long)"),
                   11, false, false);
    }
    if (ec) {
      if (IsHttpParseError(ec)) return Reply(Plain(400, "bad request"), 11, false, false);
      return Close();  // connection reset and the like
    }
    http::request<http::string_body> req = parser_->release();
    if (req.version() != 10 && req.version() != 11) {
      return Reply(Plain(505, "HTTP version not supported"), 11, false, false);
    }
    HttpRequest request;
    request.method = std::string(req.method_string());
    const beast::string_view target = req.target();
    if (target.empty() || target.front() != '/') {
      return Reply(Plain(400, "bad request target"), req.version(), false, false);
    }
    const size_t q = target.find('?');
    request.path = std::string(target.substr(0, q));
    if (q != beast::string_view::npos) request.query = std::string(target.substr(q + 1));
    for (const auto& field : req) {
      request.headers.emplace(absl::AsciiStrToLower(std::string(field.name_string())),
                              std::string(field.value()));
    }
    request.body = std::move(req.body());
    Reply(server_->router().Route(request), req.version(), request.method == "HEAD",
          req.keep_alive());
  }

  void Reply(HttpResponse response, unsigned version, bool head, bool keep_alive) {
    res_.emplace();
    res_->version(version);
    res_->result(static_cast<http::status>(response.status));
    res_->set(http::field::content_type, response.content_type);
    for (const auto& [name, value] : response.headers) res_->set(name, value);
    res_->keep_alive(keep_alive);
    const size_t length = response.body.size();
    if (!head) res_->body() = std::move(response.body);
    res_->content_length(length);
    stream_.expires_after(ToChrono(server_->options().write_timeout));
    http::async_write(stream_, *res_,
                      beast::bind_front_handler(&Session::OnWrite, shared_from_this(),
                                                !keep_alive));
  }

  void OnWrite(bool close, beast::error_code ec, size_t /*bytes*/) {
    res_.reset();
    if (ec || close) return Close();
    Read();
  }

  // Ends the connection: our side first (shutdown), then whatever the client still sends is
  // read and dropped for a moment before the socket closes. Closing with unread input would
  // make the kernel answer with a reset, which can destroy a response (say a 400 or 413) that
  // the client has not read yet.
  void Close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.expires_after(kLingerTime);
    Linger(0);
  }

  void Linger(size_t discarded) {
    if (discarded >= kLingerBytes) return stream_.close();
    stream_.async_read_some(
        net::buffer(linger_buffer_),
        [self = shared_from_this(), discarded](beast::error_code ec, size_t n) {
          if (ec) return self->stream_.close();
          self->Linger(discarded + n);
        });
  }

  beast::tcp_stream stream_;
  HttpServer::Impl* const server_;
  beast::flat_buffer buffer_;  // bounded: ReadBufferLimit
  char linger_buffer_[4096];
  std::optional<http::request_parser<http::string_body>> parser_;
  std::optional<http::response<http::string_body>> res_;
};

}  // namespace

void HttpServer::Impl::OnAccept(beast::error_code ec, tcp::socket socket) {
  if (ec == net::error::operation_aborted || !acceptor_->is_open()) return;  // stopping
  if (ec) {
    // EMFILE/ENFILE/ENOBUFS...: keep listening, after a pause.
    DCF_LOG(Warning) << "http: accept failed: " << ec.message();
    retry_timer_->expires_after(kAcceptRetryDelay);
    retry_timer_->async_wait([this](beast::error_code wait_ec) {
      if (!wait_ec) Accept();
    });
    return;
  }
  const int open = open_.load();
  if (open >= options_.max_connections) {
    // Past twice the cap the socket is just closed: refusals must not pile up either.
    if (open < 2 * options_.max_connections) {
      std::make_shared<Session>(std::move(socket), this)->Refuse();
    }
  } else {
    std::make_shared<Session>(std::move(socket), this)->Run();
  }
  Accept();
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() = default;

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options,
                                                              HttpRouter router) {
  const std::string address = absl::StrCat(options.host, ":", options.port);
  auto impl = std::make_unique<Impl>(std::move(options), std::move(router));
  if (absl::Status s = impl->Listen(); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ", s.message()));
  }
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

int HttpServer::port() const { return impl_->port(); }
int HttpServer::open_connections() const { return impl_->open_connections(); }
void HttpServer::Stop() { impl_->Stop(); }

}  // namespace dcf::server
