// The server's look at its own listening socket from outside: does a new connection to it
// get an answer? gRPC 1.51 stops accepting for good once accept() fails for lack of file
// descriptors (docs/API.md, "Security"): connections then queue in the kernel's backlog,
// unanswered, while every open connection (and the health service on them) still looks
// fine. The server probes its port every --self-check-interval and turns NOT_SERVING, then
// exits, when nobody answers.
//
// Pure functions over sockets, thread-safe.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace dcf::server {

// Where a client on this host reaches a listener bound to `host`: the loopback address of
// the same family for a wildcard address ("0.0.0.0" -> "127.0.0.1", "::" -> "::1"), else
// `host` itself.
std::string SelfCheckHost(const std::string& host);

// Connects to host:port, sends an HTTP/2 client preface and an empty SETTINGS frame, and
// waits up to `timeout` for the server to answer anything: bytes (a plaintext gRPC server
// sends its SETTINGS), or an orderly close or a reset (a TLS server refusing the plaintext).
// OK when it answered; DeadlineExceeded when the connection was made but nothing came back
// (the listener does not accept); Unavailable when no connection could be made (refused,
// no descriptor left).
absl::Status ProbeListener(const std::string& host, int port, absl::Duration timeout);

}  // namespace dcf::server
