// The server's look at its own listening socket: does it still accept connections? gRPC 1.51
// stops accepting for good once accept() fails for lack of file descriptors (docs/API.md,
// "Security"): connections then wait in the kernel's accept queue, unanswered, while every
// open connection (and the health service on them) still looks fine. The server probes its
// port every --self-check-interval and turns NOT_SERVING, then exits, when it does not.
//
// The probe connects and watches the listener's accept queue (/proc/self/net/tcp{,6}) drain,
// then closes without sending a byte: the same for a plaintext and a TLS port, and nothing
// for gRPC to log. Where procfs does not show the listener, the probe falls back to checking
// that the connect completes (ProbeListener).
//
// Pure functions over sockets and procfs (Linux), thread-safe.
#pragma once

#include <optional>
#include <string>
#include <vector>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace dcf::server {

// Where a client on this host reaches a listener bound to `host`: the loopback address of
// the same family for a wildcard address ("0.0.0.0" -> "127.0.0.1", "::" -> "::1"), else
// `host` itself.
std::string SelfCheckHost(const std::string& host);

// The accept-queue length of the TCP socket listening on `port`, from the text of
// /proc/net/tcp or /proc/net/tcp6 (the rx_queue column of its LISTEN line); nullopt when
// there is no such socket.
std::optional<int> ListenQueueLength(absl::string_view proc_net_tcp, int port);

// /proc/self/net/tcp and /proc/self/net/tcp6.
const std::vector<std::string>& ProcNetTcpTables();

// Connects to host:port and waits up to `timeout` for the listener to accept the connection
// (its accept queue, read from `tables`, empty). OK when it did; DeadlineExceeded when the
// connection was made but stayed in the queue, or the connect did not complete (the queue is
// full); Unavailable when no connection could be made (refused, or no file descriptor left).
// When the connection was made but no listener on `port` shows in `tables` (a runtime whose
// procfs does not show the network namespace), OK with *queue_visible false: only the connect
// was checked, which notices a listener that stopped accepting once its queue is full.
absl::Status ProbeListener(const std::string& host, int port, absl::Duration timeout,
                           bool* queue_visible = nullptr,
                           const std::vector<std::string>& tables = ProcNetTcpTables());

}  // namespace dcf::server
