// The client address of a gRPC peer string, without its port: what the per-client bounds
// (--max-open-streams-per-peer, the health service's Watch allowance) count by. gRPC's
// context->peer() includes the client's port, so keying on it would count per connection,
// which a client multiplies for free.
//
// "ipv4:10.0.0.7:53412" -> "ipv4:10.0.0.7"; "ipv6:[::1]:53412" (or gRPC's URI-escaped
// "ipv6:%5B::1%5D:53412") -> "ipv6:[::1]"; anything else (unix sockets, "fd:N") is returned
// as it is. A client behind a proxy or NAT shares its address with every other client there.
// Pure function, thread-safe.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace dcf::server {

std::string PeerAddress(absl::string_view grpc_peer);

}  // namespace dcf::server
