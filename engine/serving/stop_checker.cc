#include "engine/serving/stop_checker.h"

#include <algorithm>

namespace dcf {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stop_strings,
                                     bool include_stop_string)
    : stops_(std::move(stop_strings)), include_(include_stop_string) {}

std::string StopStringMatcher::Push(const std::string& piece) {
  if (matched_) return "";
  held_ += piece;
  if (stops_.empty()) {
    std::string out;
    out.swap(held_);
    return out;
  }
  // Earliest match; on equal starts the longest stop string.
  size_t best_pos = std::string::npos;
  size_t best_len = 0;
  for (const std::string& s : stops_) {
    const size_t pos = held_.find(s);
    if (pos == std::string::npos) continue;
    if (pos < best_pos || (pos == best_pos && s.size() > best_len)) {
      best_pos = pos;
      best_len = s.size();
    }
  }
  if (best_pos != std::string::npos) {
    matched_ = true;
    std::string out = held_.substr(0, include_ ? best_pos + best_len : best_pos);
    held_.clear();
    return out;
  }
  // Longest proper prefix of any stop string that is a suffix of held_.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    const size_t max_k = std::min(s.size() - 1, held_.size());
    for (size_t k = max_k; k > keep; --k) {
      if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
    }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopStringMatcher::Flush() {
  std::string out;
  if (!matched_) out.swap(held_);
  held_.clear();
  return out;
}

}  // namespace dcf
