// How client-supplied text appears in the server's log lines (request ids, service names):
// engine/common/log_text.h's LogValue (the gRPC log sink, proto/rpc/grpc_log.h, escapes the same way).
#pragma once

#include "engine/common/log_text.h"

namespace dcf::server {

using ::dcf::LogValue;

}  // namespace dcf::server
