// Who may hold the health service's Watch streams: at most `max_total` at once, at most
// `max_per_peer` from one client address (PeerAddress: the IP, any port). A new stream is
// always admitted; when a bound is full the oldest stream of the address that holds the most
// (its own address, for the per-address bound) makes room. So a flood of Watch streams from
// one address (or from many connections of one client) can push out only its own streams and
// those of the heaviest other addresses, never keep a newcomer out: a load balancer's health
// check, or a client's, always gets its stream.
//
// Pure bookkeeping (no gRPC); not thread-safe: HealthService holds its lock around it.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

namespace dcf::server {

class WatchSlots {
 public:
  // Both bounds >= 1.
  WatchSlots(int max_total, int max_per_peer);

  // Registers watcher `id` (ids grow with age: a later stream has a larger id) from `peer`.
  // Returns the watcher to close to make room for it, already unregistered; nullopt when
  // there was room.
  std::optional<uint64_t> Add(uint64_t id, const std::string& peer);
  // Unregisters `id`; an id not registered (closed to make room, or never added) is ignored.
  void Remove(uint64_t id);

  int size() const { return static_cast<int>(peer_of_.size()); }
  int from(const std::string& peer) const;

 private:
  // The oldest watcher of `peer`, unregistered.
  uint64_t TakeOldest(const std::string& peer);

  const int max_total_;
  const int max_per_peer_;
  std::map<uint64_t, std::string> peer_of_;
  std::map<std::string, std::set<uint64_t>> by_peer_;  // oldest first
};

}  // namespace dcf::server
