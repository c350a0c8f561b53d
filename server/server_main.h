// dcformer-server: serves one DCFormer model over gRPC.
//
//   dcformer-server [--model DIR] [--host 127.0.0.1] [--port 50051] [--metrics-port 9090] ...
//
// With no flags it serves the repository's default model (models/dcformer-kjv) on
// 127.0.0.1:50051 with metrics on 127.0.0.1:9090. SIGTERM/SIGINT drain it gracefully and it
// exits 0. Exit codes: 2 bad flags, 1 startup failure (port taken, model unloadable), a
// second signal, a shutdown that overran --drain-timeout + 5 s (docs/API.md, Shutdown), or a
// listener that stopped accepting connections (the self-check drains, then exits 1).
#pragma once

#include "engine/execution/backend.h"

namespace dcf::server {

// The whole program; main.cc calls it with no decorator. A test build passes one that wraps
// the loaded backend (tests/testing/server_faults_main.cc: dcformer-server-faults). Returns
// the exit code.
int ServerMain(int argc, char** argv, BackendDecorator backend_decorator);

}  // namespace dcf::server
