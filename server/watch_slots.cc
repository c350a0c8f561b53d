#include "server/watch_slots.h"

#include <algorithm>

namespace dcf::server {

WatchSlots::WatchSlots(int max_total, int max_per_peer)
    : max_total_(std::max(1, max_total)), max_per_peer_(std::max(1, max_per_peer)) {}

int WatchSlots::from(const std::string& peer) const {
  auto it = by_peer_.find(peer);
  return it == by_peer_.end() ? 0 : static_cast<int>(it->second.size());
}

uint64_t WatchSlots::TakeOldest(const std::string& peer) {
  auto it = by_peer_.find(peer);
  const uint64_t oldest = *it->second.begin();
  it->second.erase(it->second.begin());
  if (it->second.empty()) by_peer_.erase(it);
  peer_of_.erase(oldest);
  return oldest;
}

std::optional<uint64_t> WatchSlots::Add(uint64_t id, const std::string& peer) {
  std::optional<uint64_t> victim;
  if (from(peer) >= max_per_peer_) {
    victim = TakeOldest(peer);
  } else if (size() >= max_total_) {
    // The address holding the most streams gives one up (ties: the first in order).
    auto heaviest = std::max_element(by_peer_.begin(), by_peer_.end(),
                                     [](const auto& a, const auto& b) {
                                       return a.second.size() < b.second.size();
                                     });
    victim = TakeOldest(heaviest->first);
  }
  peer_of_[id] = peer;
  by_peer_[peer].insert(id);
  return victim;
}

void WatchSlots::Remove(uint64_t id) {
  auto it = peer_of_.find(id);
  if (it == peer_of_.end()) return;
  auto peer = by_peer_.find(it->second);
  peer->second.erase(id);
  if (peer->second.empty()) by_peer_.erase(peer);
  peer_of_.erase(it);
}

}  // namespace dcf::server
