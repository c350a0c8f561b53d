// One HTTP/1.1 connection of HttpServer (http_server.h): read a request, answer it (at once,
// or by pulling an HttpBodySource, streamed or not), repeat while keep-alive; every step
// under a deadline. One template for plaintext (beast::tcp_stream) and TLS
// (beast::ssl_stream over it). Everything runs on the connection's strand; the object is
// owned by its pending operations (shared_from_this).
#include <algorithm>
#include <atomic>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "boost/asio/dispatch.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/ssl.hpp"
#include "boost/asio/strand.hpp"
#include "boost/asio/write.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "boost/beast/ssl.hpp"
#include "server/http_connection.h"

namespace dcf::server {
namespace {

namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

// Framing beyond headers and body that a request may carry (chunk sizes, CRLFs, short chunk
// extensions and trailers).
constexpr size_t kReadBufferSlack = 4 << 10;
// A closing connection reads (and drops) at most this much, for at most this long: enough
// for the rest of a body a few MiB past the limit, which a client that writes its whole body
// before reading (Python's http.client, curl) is still sending when its 413 goes out; with
// 256 KiB the reset reached such a client first now and then (test_openai's 2 MiB body).
constexpr size_t kLingerBytes = 8 << 20;
constexpr auto kLingerTime = std::chrono::seconds(1);
// What the disconnect watch of an asynchronous exchange reads at a time.
constexpr size_t kWatchBytes = 4 << 10;

std::chrono::steady_clock::duration ToChrono(absl::Duration d) {
  return std::chrono::nanoseconds(absl::ToInt64Nanoseconds(d));
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

// RFC 9112 6.1: chunked must be the final (here: the only) transfer coding of a request.
// nullopt when acceptable, else the status to refuse with: 400 when chunked is not last
// ("xchunked", "chunked, gzip") or the header is repeated with Content-Length, 501 for
// codings this server does not decode ("gzip, chunked").
std::optional<int> CheckTransferEncoding(const http::request_header<>& h) {
  const auto range = h.equal_range(http::field::transfer_encoding);
  if (range.first == range.second) return std::nullopt;
  std::vector<std::string> codings;
  for (auto it = range.first; it != range.second; ++it) {
    for (absl::string_view c : absl::StrSplit(absl::string_view(it->value().data(),
                                                                it->value().size()),
                                              ',')) {
      codings.push_back(absl::AsciiStrToLower(absl::StripAsciiWhitespace(c)));
    }
  }
  if (codings.empty() || codings.back() != "chunked") return 400;
  if (h.count(http::field::content_length) > 0) return 400;  // request smuggling
  if (codings.size() > 1) return 501;
  return std::nullopt;
}

// A body sent with a Content-Encoding other than identity (gzip, br...): this server reads
// bodies as they are, so it would parse the compressed bytes (RFC 9110 15.5.16: 415).
bool HasContentCoding(const http::request_header<>& h) {
  const auto range = h.equal_range(http::field::content_encoding);
  for (auto it = range.first; it != range.second; ++it) {
    for (absl::string_view c : absl::StrSplit(absl::string_view(it->value().data(),
                                                                it->value().size()),
                                              ',')) {
      c = absl::StripAsciiWhitespace(c);
      if (!c.empty() && !absl::EqualsIgnoreCase(c, "identity")) return true;
    }
  }
  return false;
}

template <class Stream>
class Connection : public ConnectionControl,
                   public std::enable_shared_from_this<Connection<Stream>> {
 public:
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;

  Connection(tcp::socket socket, std::shared_ptr<ssl::context> tls, HttpServer::Impl* server,
             uint64_t id)
      : tls_(std::move(tls)),
        stream_(MakeStream(std::move(socket))),
        server_(server),
        options_(server->options()),
        id_(id),
        buffer_(ReadBufferLimit(options_)),
        tokens_(options_.max_requests_per_second) {}

  ~Connection() override {
    if (source_ != nullptr) source_->OnAbort("the server stopped");
    server_->Unregister(id_);
  }

  void Run() {
    net::dispatch(Lowest().get_executor(), [self = this->shared_from_this()] {
      self->Lowest().expires_after(ToChrono(self->options_.first_request_timeout));
      if constexpr (kTls) {
        self->stream_.async_handshake(ssl::stream_base::server,
                                      [self](beast::error_code ec) {
                                        if (ec) return self->Close();
                                        self->ReadRequest();
                                      });
      } else {
        self->ReadRequest();
      }
    });
  }

  // An idle connection (or one still reading a request) is closed at once, its pending read
  // failing; a busy one after its exchange.
  void Evict() override {
    net::post(Lowest().get_executor(), [self = this->shared_from_this()] {
      if (self->phase_ != ConnectionPhase::kBusy) return self->Abort("evicted");
      self->close_after_exchange_ = true;
    });
  }

  void Drain() override { Evict(); }

 private:
  Stream MakeStream(tcp::socket socket) {
    if constexpr (kTls) {
      return Stream(beast::tcp_stream(std::move(socket)), *tls_);
    } else {
      return Stream(std::move(socket));
    }
  }
  beast::tcp_stream& Lowest() { return beast::get_lowest_layer(stream_); }

  void SetPhase(ConnectionPhase phase) {
    if (phase_ == phase) return;
    phase_ = phase;
    server_->SetPhase(id_, phase);
  }

  // --- reading a request ---

  void ReadRequest() {
    if (closing_) return;
    if (close_after_exchange_ || (served_ > 0 && server_->draining())) return Close();
    if (served_ > 0) SetPhase(ConnectionPhase::kIdle);
    // The request budget: a connection past it waits for its next token before it is read.
    if (options_.max_requests_per_second > 0 && served_ > 0) {
      const auto now = std::chrono::steady_clock::now();
      const double rate = options_.max_requests_per_second;
      tokens_ = std::min(rate, tokens_ + rate * std::chrono::duration<double>(now - refill_).count());
      refill_ = now;
      if (tokens_ < 1) {
        const auto wait = std::chrono::duration<double>((1 - tokens_) / rate);
        if (!budget_timer_) budget_timer_.emplace(Lowest().get_executor());
        budget_timer_->expires_after(std::chrono::duration_cast<std::chrono::nanoseconds>(wait));
        budget_timer_->async_wait([self = this->shared_from_this()](beast::error_code ec) {
          if (!ec) self->ReadRequest();
        });
        return;
      }
      tokens_ -= 1;
    }
    parser_.emplace();
    // What a refusal before the head is parsed answers with: HTTP/1.1, a body.
    version_ = 11;
    head_only_ = false;
    parser_->header_limit(
        static_cast<uint32_t>(std::min<size_t>(options_.max_header_bytes, UINT32_MAX)));
    parser_->body_limit(options_.max_body_bytes);
    // One deadline for the idle wait and the whole request: a drip-fed request cannot extend
    // it by sending a byte now and then.
    if (served_ > 0) Lowest().expires_after(ToChrono(options_.idle_timeout));
    http::async_read_header(stream_, buffer_, *parser_,
                            beast::bind_front_handler(&Connection::OnHeader,
                                                      this->shared_from_this()));
  }

  // Whether the request line read so far ends in " HTTP/<digit>.<digit>", then CRLF or, when
  // the line's end has not arrived yet (Beast judges the version as soon as it is read),
  // nothing or CR.
  bool RequestLineHasWellFormedVersion() const {
    const absl::string_view read(static_cast<const char*>(buffer_.data().data()),
                                 buffer_.size());
    absl::string_view line = read.substr(0, read.find('\n'));
    const bool complete = line.size() < read.size();
    if (!absl::ConsumeSuffix(&line, "\r") && complete) return false;  // a bare LF
    if (line.size() < 9) return false;
    const absl::string_view v = line.substr(line.size() - 9);  // " HTTP/d.d"
    return absl::StartsWith(v, " HTTP/") && absl::ascii_isdigit(v[6]) && v[7] == '.' &&
           absl::ascii_isdigit(v[8]);
  }

  // Maps a read error to the refusal it deserves; false when the connection just closes.
  bool RefuseReadError(const beast::error_code& ec) {
    if (ec == http::error::header_limit) {
      Refuse(431, "request header fields too large");
    } else if (ec == http::error::body_limit) {
      Refuse(413, "payload too large");
    } else if (ec == http::error::buffer_overflow) {
      // Chunk extensions or trailers past the read buffer's bound.
      Refuse(400, "bad request: the request's framing does not fit in the read buffer "
                  "(chunk extensions or trailers too long)");
    } else if (ec == http::error::bad_version) {
      // Beast's word both for another version (HTTP/2.0: 505) and for a malformed version
      // token, e.g. a request line ending in a bare LF (400).
      if (RequestLineHasWellFormedVersion()) {
        Refuse(505, "HTTP version not supported (only HTTP/1.x)");
      } else {
        Refuse(400, "bad request: malformed HTTP version (a request line ends in CRLF)");
      }
    } else if (IsHttpParseError(ec) && ec != http::error::partial_message &&
               ec != http::error::end_of_stream) {
      Refuse(400, "bad request");
    } else {
      return false;  // timeout, end of stream, reset...
    }
    return true;
  }

  void OnHeader(beast::error_code ec, size_t /*bytes*/) {
    if (ec) {
      if (!RefuseReadError(ec)) Close();
      return;
    }
    SetPhase(ConnectionPhase::kBusy);
    const http::request_header<>& h = parser_->get().base();
    version_ = h.version();
    head_only_ = h.method() == http::verb::head;
    if (std::optional<int> refused = CheckTransferEncoding(h)) {
      return Refuse(*refused, *refused == 501 ? "transfer coding not implemented (only chunked)"
                                              : "bad request: Transfer-Encoding must be chunked");
    }
    if ((parser_->chunked() || parser_->content_length().value_or(0) > 0) &&
        HasContentCoding(h)) {
      return Refuse(415, "content coding not supported: send the body without Content-Encoding");
    }
    const beast::string_view target = h.target();
    if (target.empty() || target.front() != '/') return Refuse(400, "bad request target");
    request_ = HttpRequest();
    request_.method = std::string(h.method_string());
    const size_t q = target.find('?');
    request_.path = std::string(target.substr(0, q));
    if (q != beast::string_view::npos) request_.query = std::string(target.substr(q + 1));
    for (const auto& field : h) {
      request_.headers.emplace(absl::AsciiStrToLower(std::string(field.name_string())),
                               std::string(field.value()));
    }
    beast::error_code peer_ec;
    const tcp::endpoint peer = Lowest().socket().remote_endpoint(peer_ec);
    if (!peer_ec) request_.peer = peer.address().to_string();
    keep_alive_ = parser_->get().keep_alive();
    if (options_.admit) {
      if (std::optional<HttpResponse> refusal = options_.admit(request_)) {
        return Reply(std::move(*refusal), /*keep_alive=*/false);
      }
    }
    if (server_->draining()) {
      if (!options_.draining_response) return Refuse(503, "server is shutting down");
      return Reply(options_.draining_response(request_), /*keep_alive=*/false);
    }
    if (parser_->is_done()) return OnBody({}, 0);
    if (beast::iequals(h[http::field::expect], "100-continue")) {
      // curl waits a second for this before sending a body over 1 KiB.
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      return net::async_write(stream_, net::buffer(kContinue),
                              [self = this->shared_from_this()](beast::error_code ec, size_t) {
                                if (ec) return self->Close();
                                self->ReadBody();
                              });
    }
    ReadBody();
  }

  void ReadBody() {
    http::async_read(stream_, buffer_, *parser_,
                     beast::bind_front_handler(&Connection::OnBody, this->shared_from_this()));
  }

  void OnBody(beast::error_code ec, size_t /*bytes*/) {
    if (ec) {
      if (!RefuseReadError(ec)) Close();
      return;
    }
    request_.body = std::move(parser_->get().body());
    parser_.reset();
    HttpResponse refusal;
    const HttpRouter::Handlers* route = server_->router().Find(request_, &refusal);
    if (route == nullptr) {
      if (options_.error_response) {
        std::string message = refusal.body;
        while (!message.empty() && message.back() == '\n') message.pop_back();
        HttpResponse shaped = options_.error_response(refusal.status, message);
        for (auto& header : refusal.headers) shaped.headers.push_back(std::move(header));
        refusal = std::move(shaped);
      }
      return Reply(std::move(refusal), keep_alive_);
    }
    if (route->sync) return Reply(route->sync(request_), keep_alive_);
    // Over TLS the disconnect watch cannot be cancelled cleanly mid-record: an asynchronous
    // exchange is the connection's last.
    if (kTls) keep_alive_ = false;
    wake_pending_ = std::make_shared<std::atomic<bool>>(false);
    source_ = route->async(std::move(request_), MakeWake());
    if (source_ == nullptr) return Reply(PlainResponse(500, "no response"), false);
    Watch();
    Poll();
  }

  // --- whole responses ---

  void Refuse(int status, std::string body) {
    Reply(options_.error_response ? options_.error_response(status, body)
                                  : PlainResponse(status, std::move(body)),
          false);
  }

  void Reply(HttpResponse response, bool keep_alive) {
    SetPhase(ConnectionPhase::kBusy);
    keep_alive = keep_alive && !close_after_exchange_ && !server_->draining();
    res_.emplace();
    res_->version(version_);
    res_->result(static_cast<http::status>(response.status));
    res_->set(http::field::content_type, response.content_type);
    for (const auto& [name, value] : response.headers) res_->set(name, value);
    res_->keep_alive(keep_alive);
    const size_t length = response.body.size();
    if (!head_only_) res_->body() = std::move(response.body);
    res_->content_length(length);
    writing_ = true;
    Lowest().expires_after(ToChrono(options_.write_timeout));
    http::async_write(stream_, *res_,
                      [self = this->shared_from_this(), keep_alive](beast::error_code ec, size_t) {
                        self->writing_ = false;
                        self->res_.reset();
                        if (ec) return self->Abort("the response could not be written");
                        self->EndExchange(keep_alive);
                      });
  }

  // --- asynchronous responses ---

  HttpWake MakeWake() {
    std::weak_ptr<Connection> weak = this->shared_from_this();
    std::shared_ptr<std::atomic<bool>> pending = wake_pending_;
    return [weak, pending] {
      if (pending->exchange(true)) return;  // a wake is already on its way
      if (std::shared_ptr<Connection> self = weak.lock()) {
        net::post(self->Lowest().get_executor(), [self, pending] {
          pending->store(false);
          if (self->wake_pending_ != pending) return;  // another exchange's
          self->OnWake();
        });
      }
    };
  }

  void OnWake() {
    if (source_ == nullptr) return;
    if (writing_) {
      if (!source_->KeepWaiting()) Abort("the client reads slower than its output arrives");
      return;
    }
    Poll();
  }

  void Poll() {
    while (source_ != nullptr && !writing_ && out_.empty()) {
      HttpPull pull = source_->Pull();
      switch (pull.kind) {
        case HttpPull::Kind::kWait:
          return;
        case HttpPull::Kind::kResponse:
          if (streaming_) return Abort("a response after the stream started");
          source_.reset();
          EndWatch();
          return Reply(std::move(pull.response), keep_alive_);
        case HttpPull::Kind::kStreamHead:
          if (streaming_) return Abort("a second stream head");
          return WriteHead(std::move(pull.response));
        case HttpPull::Kind::kData:
        case HttpPull::Kind::kEnd:
          if (!streaming_) return Abort("stream data before its head");
          out_ = std::move(pull.data);
          ending_ = pull.kind == HttpPull::Kind::kEnd;
          if (ending_) source_.reset();
          return WriteSlice();
      }
    }
  }

  void WriteHead(HttpResponse head) {
    streaming_ = true;
    chunked_ = version_ >= 11;
    if (!chunked_) keep_alive_ = false;  // HTTP/1.0: the body ends with the connection
    keep_alive_ = keep_alive_ && !close_after_exchange_ && !server_->draining();
    head_.emplace();
    head_->version(version_);
    head_->result(static_cast<http::status>(head.status));
    head_->set(http::field::content_type, head.content_type);
    head_->set(http::field::cache_control, "no-cache");
    for (const auto& [name, value] : head.headers) head_->set(name, value);
    head_->keep_alive(keep_alive_);
    if (chunked_) head_->chunked(true);
    serializer_.emplace(*head_);
    out_ = std::move(head.body);
    writing_ = true;
    Lowest().expires_after(ToChrono(options_.stream_write_timeout));
    http::async_write_header(stream_, *serializer_,
                             [self = this->shared_from_this()](beast::error_code ec, size_t) {
                               self->writing_ = false;
                               if (ec) return self->Abort("the stream's head could not be written");
                               self->WriteSlice();
                             });
  }

  // Writes the next slice of out_, the last chunk once the source ended, or pulls again.
  void WriteSlice() {
    if (closing_) return;
    if (out_.empty() && !ending_) return Poll();
    if (out_.empty() && ending_) {
      ending_ = false;
      if (!chunked_) return EndExchange(false);
      writing_ = true;
      Lowest().expires_after(ToChrono(options_.stream_write_timeout));
      return net::async_write(stream_, http::make_chunk_last(),
                              [self = this->shared_from_this()](beast::error_code ec, size_t) {
                                self->writing_ = false;
                                if (ec) return self->Abort("the stream's end could not be written");
                                self->streaming_ = false;
                                self->EndWatch();
                                self->EndExchange(self->keep_alive_);
                              });
    }
    const size_t n = std::min(out_.size(), kStreamSliceBytes);
    slice_.assign(out_, 0, n);
    out_.erase(0, n);
    writing_ = true;
    Lowest().expires_after(ToChrono(options_.stream_write_timeout));
    auto done = [self = this->shared_from_this()](beast::error_code ec, size_t) {
      self->writing_ = false;
      if (ec) {
        return self->Abort(ec == beast::error::timeout
                               ? "a write made no progress within the stream write timeout"
                               : "the client closed the connection");
      }
      self->WriteSlice();
    };
    if (chunked_) {
      net::async_write(stream_, http::make_chunk(net::buffer(slice_)), std::move(done));
    } else {
      net::async_write(stream_, net::buffer(slice_), std::move(done));
    }
  }

  // The disconnect watch: while an asynchronous exchange waits or streams, a read stays
  // pending on the socket. End of stream or an error aborts the exchange; bytes (a pipelined
  // request) stay in the buffer for the next request.
  void Watch() {
    if (watching_ || closing_) return;
    const size_t room = buffer_.max_size() - buffer_.size();
    if (room == 0) return;  // full: writes and their deadlines still catch a dead client
    watching_ = true;
    Lowest().expires_never();
    stream_.async_read_some(
        buffer_.prepare(std::min(room, kWatchBytes)),
        [self = this->shared_from_this()](beast::error_code ec, size_t n) {
          self->watching_ = false;
          if (!ec) self->buffer_.commit(n);
          if (self->closing_) {
            self->Lowest().expires_after(kLingerTime);
            return self->Linger(0);
          }
          if (self->resume_after_watch_) {
            self->resume_after_watch_ = false;
            if (ec && ec != net::error::operation_aborted) return self->Close();
            return self->ReadRequest();
          }
          if (ec) {
            // A write's deadline closed the socket: the write's handler says why.
            if (ec == net::error::operation_aborted && self->writing_) return;
            if (self->source_ != nullptr || self->streaming_) {
              return self->Abort("the client closed the connection");
            }
            return;  // the exchange ended meanwhile; its own path goes on
          }
          if (self->source_ != nullptr || self->streaming_) self->Watch();
        });
  }

  // The exchange is over: the watch (if pending) must stop before the next read starts.
  void EndWatch() {
    if (!watching_) return;
    if constexpr (kTls) {
      keep_alive_ = false;  // see OnBody
    } else {
      beast::error_code ignored;
      Lowest().socket().cancel(ignored);
    }
  }

  void EndExchange(bool keep_alive) {
    ++served_;
    streaming_ = false;
    wake_pending_.reset();
    if (!keep_alive || close_after_exchange_ || server_->draining()) return Close();
    SetPhase(ConnectionPhase::kIdle);
    if (watching_) {
      resume_after_watch_ = true;  // ReadRequest once the cancelled watch returns
      return;
    }
    ReadRequest();
  }

  // --- closing ---

  void Abort(absl::string_view reason) {
    if (source_ != nullptr) {
      std::shared_ptr<HttpBodySource> source = std::move(source_);
      source->OnAbort(reason);
    }
    streaming_ = false;
    if (closing_) return;
    closing_ = true;
    SetPhase(ConnectionPhase::kClosing);
    beast::error_code ignored;
    Lowest().socket().shutdown(tcp::socket::shutdown_both, ignored);
    Lowest().close();
  }

  // Ends the connection: our side first, then whatever the client still sends is read and
  // dropped for a moment before the socket closes. Closing with unread input would make the
  // kernel answer with a reset, which can destroy a response (say a 400 or 413) that the
  // client has not read yet.
  void Close() {
    if (closing_) return;
    closing_ = true;
    SetPhase(ConnectionPhase::kClosing);
    if (source_ != nullptr) {
      std::shared_ptr<HttpBodySource> source = std::move(source_);
      source->OnAbort("the connection closed");
    }
    beast::error_code ignored;
    Lowest().socket().shutdown(tcp::socket::shutdown_send, ignored);
    if (watching_) {
      // The pending watch read returns now (cancelled), then lingers; a TLS stream is closed.
      if constexpr (kTls) {
        Lowest().close();
      } else {
        Lowest().socket().cancel(ignored);
      }
      return;
    }
    Lowest().expires_after(kLingerTime);
    Linger(0);
  }

  void Linger(size_t discarded) {
    if (discarded >= kLingerBytes) return Lowest().close();
    Lowest().async_read_some(net::buffer(linger_buffer_),
                             [self = this->shared_from_this(), discarded](beast::error_code ec,
                                                                          size_t n) {
                               if (ec) return self->Lowest().close();
                               self->Linger(discarded + n);
                             });
  }

  const std::shared_ptr<ssl::context> tls_;  // before stream_, which refers to it
  Stream stream_;
  HttpServer::Impl* const server_;
  const HttpServerOptions& options_;
  const uint64_t id_;
  beast::flat_buffer buffer_;  // bounded: ReadBufferLimit
  char linger_buffer_[4096];

  ConnectionPhase phase_ = ConnectionPhase::kFirstRequest;
  int64_t served_ = 0;  // exchanges completed
  double tokens_;       // the request budget's bucket
  std::chrono::steady_clock::time_point refill_ = std::chrono::steady_clock::now();
  std::optional<net::steady_timer> budget_timer_;

  std::optional<http::request_parser<http::string_body>> parser_;
  HttpRequest request_;
  unsigned version_ = 11;
  bool head_only_ = false;
  bool keep_alive_ = true;
  std::optional<http::response<http::string_body>> res_;

  std::shared_ptr<HttpBodySource> source_;
  std::shared_ptr<std::atomic<bool>> wake_pending_;  // per exchange
  std::optional<http::response<http::empty_body>> head_;
  std::optional<http::response_serializer<http::empty_body>> serializer_;
  std::string out_;    // stream bytes not yet written
  std::string slice_;  // the write in flight
  bool streaming_ = false;
  bool chunked_ = true;
  bool ending_ = false;
  bool writing_ = false;
  bool watching_ = false;
  bool resume_after_watch_ = false;
  bool close_after_exchange_ = false;
  bool closing_ = false;
};

}  // namespace

std::shared_ptr<ConnectionControl> StartConnection(tcp::socket socket,
                                                   std::shared_ptr<ssl::context> tls,
                                                   HttpServer::Impl* server, uint64_t id) {
  if (tls != nullptr) {
    auto c = std::make_shared<Connection<beast::ssl_stream<beast::tcp_stream>>>(
        std::move(socket), std::move(tls), server, id);
    c->Run();
    return c;
  }
  auto c = std::make_shared<Connection<beast::tcp_stream>>(std::move(socket), nullptr, server, id);
  c->Run();
  return c;
}

void RefuseConnection(tcp::socket socket, HttpServer::Impl* /*server*/) {
  // A fresh socket's send buffer is empty: this short answer goes out without waiting.
  static const std::string kAnswer =
      "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
      "Content-Length: 21\r\nConnection: close\r\n\r\ntoo many connections\n";
  boost::system::error_code ec;
  socket.non_blocking(true, ec);
  socket.write_some(net::buffer(kAnswer), ec);
  socket.shutdown(tcp::socket::shutdown_send, ec);
  socket.close(ec);
}

}  // namespace dcf::server
