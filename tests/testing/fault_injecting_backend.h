// Test-only fault injection for the serving path: a Backend decorator that fails or stalls a
// step that prefills a prompt starting with a chosen token id, so that a test can break the
// engine on purpose with an ordinary request (generated tokens never trigger it). It is
// compiled only into build/bin/dcformer-server-faults, the server's main program
// (server/server_main.h) with this decorator and the flags below
// (tests/integration/server_faults_main.cc);
// release binaries carry none of it.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "engine/execution/backend.h"

namespace dcf::testing {

struct FaultPlan {
  // A step that prefills a prompt starting with this token fails with
  // Internal("injected backend fault ...").
  std::optional<int32_t> fail_token;
  // A step that prefills a prompt starting with this token blocks before running until
  // `release_file` exists (polled every 10 ms), as a hung device would.
  std::optional<int32_t> stall_token;
  std::string release_file;
};

std::unique_ptr<Backend> InjectFaults(std::unique_ptr<Backend> inner, FaultPlan plan);

// The plan given by the test-only flags --fault-fail-token, --fault-stall-token and
// --fault-release-file (defined in fault_injecting_backend.cc), as a server decorator. The
// flags are read when the decorator runs, so it may be made before they are parsed.
BackendDecorator FaultInjectionFromFlags();

}  // namespace dcf::testing
