#include "server/peer_address.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace dcf::server {

std::string PeerAddress(absl::string_view grpc_peer) {
  if (absl::StartsWith(grpc_peer, "ipv4:")) {
    const size_t colon = grpc_peer.rfind(':');
    return std::string(colon > 4 ? grpc_peer.substr(0, colon) : grpc_peer);
  }
  if (absl::StartsWith(grpc_peer, "ipv6:")) {
    const std::string unescaped =
        absl::StrReplaceAll(grpc_peer, {{"%5B", "["}, {"%5D", "]"}, {"%5b", "["}, {"%5d", "]"}});
    const size_t close = unescaped.rfind(']');
    if (close != std::string::npos) return unescaped.substr(0, close + 1);
    return unescaped;
  }
  return std::string(grpc_peer);
}

}  // namespace dcf::server
