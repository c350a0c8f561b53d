// dcformer-server-faults: the server's main program (server/server_main.h) with the test-only
// fault-injecting backend and its flags (fault_injecting_backend.h). The integration tests use
// it to fail and stall the engine on purpose; build/bin/dcformer-server carries none of it.
#include "server/server_main.h"
#include "tests/testing/fault_injecting_backend.h"

int main(int argc, char** argv) {
  return dcf::server::ServerMain(argc, argv, dcf::testing::FaultInjectionFromFlags());
}
