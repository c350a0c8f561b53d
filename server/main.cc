// dcformer-server (server_main.h).
#include "server/server_main.h"

int main(int argc, char** argv) { return dcf::server::ServerMain(argc, argv, nullptr); }
