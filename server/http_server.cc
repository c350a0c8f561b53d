#include "server/http_server.h"

#include <algorithm>
#include <new>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "boost/asio/ssl.hpp"
#include "boost/asio/strand.hpp"
#include "boost/asio/write.hpp"
#include "engine/common/logging.h"
#include "server/http_connection.h"

namespace dcf::server {
namespace {

namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
using tcp = net::ip::tcp;

// After accept() fails (out of file descriptors, say), the next try waits this long instead
// of spinning; the listener never gives up (gRPC 1.51's does: docs/API.md, "Security"). The
// failure is logged at most once per kAcceptLogInterval.
constexpr auto kAcceptRetryDelay = std::chrono::milliseconds(100);
constexpr absl::Duration kAcceptLogInterval = absl::Seconds(10);

}  // namespace

HttpResponse PlainResponse(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  r.body.push_back('\n');
  return r;
}

const std::string* HttpRequest::Header(const std::string& name) const {
  auto it = headers.find(name);
  return it == headers.end() ? nullptr : &it->second;
}

void HttpRouter::Add(std::string method, std::string path, HttpHandler handler) {
  routes_[std::move(path)][std::move(method)].sync = std::move(handler);
}

void HttpRouter::AddAsync(std::string method, std::string path, HttpAsyncHandler handler) {
  routes_[std::move(path)][std::move(method)].async = std::move(handler);
}

const HttpRouter::Handlers* HttpRouter::Find(const HttpRequest& request,
                                          HttpResponse* refusal) const {
  auto path = routes_.find(request.path);
  if (path == routes_.end()) {
    *refusal = PlainResponse(404, "not found");
    return nullptr;
  }
  const std::map<std::string, Handlers>& methods = path->second;
  auto it = methods.find(request.method);
  if (it == methods.end() && request.method == "HEAD") {
    it = methods.find("GET");
    if (it != methods.end() && !it->second.sync) it = methods.end();  // no HEAD of a stream
  }
  if (it != methods.end()) return &it->second;
  std::vector<std::string> allowed;
  for (const auto& [method, route] : methods) {
    allowed.push_back(method);
    if (method == "GET" && route.sync) allowed.push_back("HEAD");
  }
  std::sort(allowed.begin(), allowed.end());
  *refusal = PlainResponse(405, "method not allowed");
  refusal->headers.emplace_back("Allow", absl::StrJoin(allowed, ", "));
  return nullptr;
}

HttpResponse HttpRouter::Route(const HttpRequest& request) const {
  HttpResponse refusal;
  const Handlers* route = Find(request, &refusal);
  if (route == nullptr) return refusal;
  if (!route->sync) return PlainResponse(500, "asynchronous route");
  return route->sync(request);
}

namespace {

absl::StatusOr<std::shared_ptr<ssl::context>> LoadTls(const HttpServerOptions& o) {
  auto context = std::make_shared<ssl::context>(ssl::context::tls_server);
  context->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                       ssl::context::no_sslv3 | ssl::context::no_tlsv1 |
                       ssl::context::no_tlsv1_1 | ssl::context::single_dh_use);
  boost::system::error_code ec;
  context->use_certificate_chain_file(o.tls_identity_file, ec);
  if (!ec) context->use_private_key_file(o.tls_identity_file, ssl::context::pem, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("TLS certificate or key does not load: ", ec.message()));
  }
  if (!o.tls_client_ca_file.empty()) {
    context->load_verify_file(o.tls_client_ca_file, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("TLS client CA does not load: ", ec.message()));
    }
    context->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
  }
  return context;
}

}  // namespace

HttpServer::Impl::Impl(HttpServerOptions options, HttpRouter router)
    : options_(std::move(options)),
      router_(std::move(router)),
      ioc_(std::make_unique<net::io_context>(std::max(1, options_.threads))),
      acceptor_(std::make_unique<tcp::acceptor>(net::make_strand(*ioc_))),
      retry_timer_(std::make_unique<net::steady_timer>(acceptor_->get_executor())) {}

HttpServer::Impl::~Impl() { Stop(); }

absl::Status HttpServer::Impl::ReloadTls() {
  if (options_.tls_identity_file.empty()) return absl::OkStatus();
  absl::StatusOr<std::shared_ptr<ssl::context>> loaded = LoadTls(options_);
  if (!loaded.ok()) return loaded.status();
  absl::MutexLock lock(&mu_);
  tls_ = *std::move(loaded);
  return absl::OkStatus();
}

absl::Status HttpServer::Impl::Listen() {
  if (absl::Status s = ReloadTls(); !s.ok()) return s;
  boost::system::error_code ec;
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
  try {
    for (int i = 0; i < std::max(1, options_.threads); ++i) {
      threads_.emplace_back([ioc] { ioc->run(); });
    }
  } catch (const std::system_error& e) {  // a pids cgroup, RLIMIT_NPROC, no memory for a stack
    Stop();  // joins the threads that started
    return absl::ResourceExhaustedError(absl::StrCat("cannot start its threads: ", e.what()));
  } catch (const std::bad_alloc&) {
    Stop();
    return absl::ResourceExhaustedError("cannot start its threads: out of memory");
  }
  return absl::OkStatus();
}

void HttpServer::Impl::Stop() {
  if (stopped_.exchange(true)) return;
  ioc_->stop();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  // No thread runs handlers any more: close the listener, then destroy the pending
  // operations, and with them every connection (they only touch this object's bookkeeping
  // and options, which outlive them).
  retry_timer_.reset();
  acceptor_.reset();
  ioc_.reset();
}

int HttpServer::Impl::open_connections() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(connections_.size());
}

void HttpServer::Impl::Event(absl::string_view what) {
  if (options_.on_connection_event) options_.on_connection_event(what);
}

void HttpServer::Impl::StartDraining() {
  draining_.store(true);
  std::vector<std::shared_ptr<ConnectionControl>> all;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, entry] : connections_) {
      if (auto c = entry.connection.lock()) {
        all.push_back(std::move(c));
      } else {
        entry.drain_when_started = true;  // counted, still starting: OnAccept drains it
      }
    }
  }
  for (const auto& c : all) c->Drain();
}

bool HttpServer::Impl::AwaitNoBusyConnections(absl::Time deadline) const {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (std::none_of(connections_.begin(), connections_.end(), [](const auto& c) {
            return c.second.phase == ConnectionPhase::kBusy;
          })) {
        return true;
      }
    }
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(std::min(absl::Milliseconds(5), deadline - absl::Now()));
  }
}

void HttpServer::Impl::SetPhase(uint64_t id, ConnectionPhase phase) {
  absl::MutexLock lock(&mu_);
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  it->second.phase = phase;
  it->second.last_change = ++clock_;
}

void HttpServer::Impl::Unregister(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = connections_.find(id);
  if (it == connections_.end()) return;
  auto count = per_address_.find(it->second.address);
  if (count != per_address_.end() && --count->second <= 0) per_address_.erase(count);
  connections_.erase(it);
}

std::shared_ptr<ConnectionControl> HttpServer::Impl::PickVictim(const std::string& address) {
  Entry* best = nullptr;
  auto older = [](const Entry& a, const Entry& b) {
    // Never-finished first, then the longest unchanged.
    const bool a_first = a.phase == ConnectionPhase::kFirstRequest;
    const bool b_first = b.phase == ConnectionPhase::kFirstRequest;
    if (a_first != b_first) return a_first;
    return a.last_change < b.last_change;
  };
  for (auto& [id, entry] : connections_) {
    if (entry.evicted || entry.phase == ConnectionPhase::kBusy ||
        entry.phase == ConnectionPhase::kClosing) {
      continue;
    }
    if (!address.empty() && entry.address != address) continue;
    if (best == nullptr || older(entry, *best)) best = &entry;
  }
  if (best == nullptr) return nullptr;
  best->evicted = true;
  return best->connection.lock();
}

void HttpServer::Impl::Accept() {
  acceptor_->async_accept(net::make_strand(*ioc_),
                          [this](boost::system::error_code ec, tcp::socket s) {
                            OnAccept(ec, std::move(s));
                          });
}

void HttpServer::Impl::OnAccept(boost::system::error_code ec, tcp::socket socket) {
  if (ec == net::error::operation_aborted || !acceptor_->is_open()) return;  // stopping
  if (ec) {
    // EMFILE/ENFILE/ENOBUFS...: keep listening, after a pause; log it now and then only.
    static absl::Time last_logged = absl::InfinitePast();
    if (absl::Now() - last_logged > kAcceptLogInterval) {
      last_logged = absl::Now();
      DCF_LOG(Warning) << "http: accept failed: " << ec.message() << " (retrying)";
    }
    retry_timer_->expires_after(kAcceptRetryDelay);
    retry_timer_->async_wait([this](boost::system::error_code wait_ec) {
      if (!wait_ec) Accept();
    });
    return;
  }
  boost::system::error_code peer_ec;
  const tcp::endpoint peer = socket.remote_endpoint(peer_ec);
  const std::string address = peer_ec ? std::string() : peer.address().to_string();
  std::shared_ptr<ConnectionControl> victim;
  bool refuse = false;
  uint64_t id = 0;
  std::shared_ptr<ssl::context> tls;
  {
    absl::MutexLock lock(&mu_);
    const int total = static_cast<int>(connections_.size());
    const int from_address = per_address_.count(address) ? per_address_[address] : 0;
    const bool address_full =
        options_.max_connections_per_ip > 0 && from_address >= options_.max_connections_per_ip;
    const bool full = total >= options_.max_connections;
    if (address_full || full) {
      // Make room from the same address first when that is the cap that binds.
      victim = PickVictim(address_full ? address : std::string());
      if (victim == nullptr && !address_full) victim = PickVictim(std::string());
      refuse = victim == nullptr;
      // Far past the cap (evictions still closing) nothing more is admitted either.
      if (!refuse && total >= 2 * options_.max_connections) refuse = true;
    }
    if (!refuse) {
      id = next_id_++;
      Entry& entry = connections_[id];
      entry.address = address;
      entry.last_change = ++clock_;
      ++per_address_[address];
      tls = tls_;
    }
  }
  if (victim != nullptr) {
    victim->Evict();
    Event("evicted");
  }
  if (refuse) {
    Event("refused");
    RefuseConnection(std::move(socket), this);
  } else {
    std::shared_ptr<ConnectionControl> connection =
        StartConnection(std::move(socket), std::move(tls), this, id);
    bool drain = false;
    {
      absl::MutexLock lock(&mu_);
      auto it = connections_.find(id);
      if (it != connections_.end()) {
        it->second.connection = connection;
        drain = it->second.drain_when_started;
      }
    }
    if (drain) connection->Drain();
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
    if (absl::IsInvalidArgument(s)) return s;
    if (absl::IsResourceExhausted(s)) {
      return absl::ResourceExhaustedError(absl::StrCat(address, ": ", s.message()));
    }
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ", s.message()));
  }
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

int HttpServer::port() const { return impl_->port(); }
int HttpServer::open_connections() const { return impl_->open_connections(); }
absl::Status HttpServer::ReloadTls() { return impl_->ReloadTls(); }
void HttpServer::StartDraining() { impl_->StartDraining(); }
bool HttpServer::AwaitExchanges(absl::Time deadline) const {
  return impl_->AwaitNoBusyConnections(deadline);
}
void HttpServer::Stop() { impl_->Stop(); }

}  // namespace dcf::server
