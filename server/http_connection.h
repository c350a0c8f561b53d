// Internal to http_server.cc and http_connection.cc: the listener's bookkeeping of its
// connections (caps, eviction, drain) and the connection objects it starts.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/ssl/context.hpp"
#include "boost/asio/steady_timer.hpp"
#include "server/http_server.h"

namespace dcf::server {

// Where a connection is in its life, as the caps see it.
enum class ConnectionPhase {
  kFirstRequest,  // has not finished a request yet (evicted first, oldest first)
  kIdle,          // between requests (or reading the next one): evicted next
  kBusy,          // handling a request or writing / streaming its response: never evicted
  kClosing,       // its last exchange over (response written, or abandoned): closing
};

// What the listener may ask of a connection, from any thread (each posts to its strand).
class ConnectionControl {
 public:
  virtual ~ConnectionControl() = default;
  // Closes the connection unless it is busy (then it closes after its exchange).
  virtual void Evict() = 0;
  // Closes it when idle; a busy one answers no further request.
  virtual void Drain() = 0;
};

class HttpServer::Impl {
 public:
  Impl(HttpServerOptions options, HttpRouter router);
  ~Impl();

  absl::Status Listen();
  absl::Status ReloadTls();
  void StartDraining();
  void Stop();

  int port() const { return port_; }
  int open_connections() const;
  const HttpServerOptions& options() const { return options_; }
  const HttpRouter& router() const { return router_; }
  bool draining() const { return draining_.load(); }

  // Waits until no connection is kBusy, or `deadline`; false when some still are.
  bool AwaitNoBusyConnections(absl::Time deadline) const;

  // Connection bookkeeping (http_connection.cc calls these from the connections' strands).
  void SetPhase(uint64_t id, ConnectionPhase phase);
  void Unregister(uint64_t id);

 private:
  struct Entry {
    std::weak_ptr<ConnectionControl> connection;
    std::string address;
    ConnectionPhase phase = ConnectionPhase::kFirstRequest;
    uint64_t last_change = 0;  // a sequence number: smaller is older
    bool evicted = false;
    // A drain began between this connection's count and its start (OnAccept sets
    // `connection` after StartConnection): OnAccept drains it then, as StartDraining would
    // have. A connection accepted after the drain began is not drained: its request is
    // answered (503, or draining_response) and it closes after.
    bool drain_when_started = false;
  };

  void Accept();
  void OnAccept(boost::system::error_code ec, boost::asio::ip::tcp::socket socket);
  // At a cap: the oldest evictable connection (of `address`, or of any when empty), marked
  // evicted; null when every candidate is busy.
  std::shared_ptr<ConnectionControl> PickVictim(const std::string& address)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Event(absl::string_view what);

  const HttpServerOptions options_;
  const HttpRouter router_;
  std::atomic<bool> stopped_{false};
  std::atomic<bool> draining_{false};
  int port_ = 0;

  mutable absl::Mutex mu_;
  std::map<uint64_t, Entry> connections_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> per_address_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<boost::asio::ssl::context> tls_ ABSL_GUARDED_BY(mu_);  // null: plaintext

  // Destroyed before the members above, which the connections pending in it use (Stop()).
  std::unique_ptr<boost::asio::io_context> ioc_;
  std::unique_ptr<boost::asio::ip::tcp::acceptor> acceptor_;
  std::unique_ptr<boost::asio::steady_timer> retry_timer_;
  std::vector<std::thread> threads_;
};

// Starts serving an accepted socket (plaintext when `tls` is null): registered as `id`.
// Returns its control, which the listener keeps weakly.
std::shared_ptr<ConnectionControl> StartConnection(
    boost::asio::ip::tcp::socket socket, std::shared_ptr<boost::asio::ssl::context> tls,
    HttpServer::Impl* server, uint64_t id);
// Answers 503 on `socket` and closes it (at a cap with every connection busy).
void RefuseConnection(boost::asio::ip::tcp::socket socket, HttpServer::Impl* server);

// The canned plain-text answer for `status`: "<body>\n".
HttpResponse PlainResponse(int status, std::string body);

}  // namespace dcf::server
