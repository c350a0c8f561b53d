// Waiting for a server that is starting (loading its model, warming up) or not listening yet,
// instead of failing at once: what `dcformer-cli --wait-ready[=TIMEOUT]` does before its call.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/client_channel.h"

namespace dcf::client {

// What a bare --wait-ready waits for.
inline constexpr absl::Duration kDefaultWaitReady = absl::Seconds(60);

// Blocks until the server reports `service` ("" = the whole server) SERVING on the standard
// health service, at most `timeout`. It watches grpc.health.v1.Health/Watch with gRPC's
// wait-for-ready, so the call waits for a connection (the channel keeps reconnecting) rather
// than failing with UNAVAILABLE, then reads status changes until SERVING; a watch that ends
// early (the server restarted) is started again. The health service needs no API key.
// OK once SERVING; DeadlineExceeded naming the target and what was last seen ("no connection:
// ..." or "last status NOT_SERVING") when `timeout` passes; the call's own status for other
// failures (UNIMPLEMENTED: no health service there).
absl::Status WaitUntilServing(const ClientChannel& channel, const std::string& target,
                              const std::string& service, absl::Duration timeout);

}  // namespace dcf::client
