#include "engine/common/memory_info.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace dcf {
namespace {

// cgroup v1 reports "no limit" as a huge page-rounded number (e.g. 9223372036854771712).
constexpr size_t kUnlimitedAbove = size_t{1} << 60;

std::optional<size_t> ReadLimitFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string text;
  std::getline(in, text);
  text = std::string(absl::StripAsciiWhitespace(text));
  size_t value = 0;
  if (text == "max" || !absl::SimpleAtoi(text, &value) || value >= kUnlimitedAbove) {
    return std::nullopt;
  }
  return value;
}

// The smallest limit in `file` of `dir` and its parents up to `root`.
std::optional<size_t> SmallestOnPath(const std::string& root, std::string dir,
                                     const std::string& file) {
  std::optional<size_t> best;
  while (true) {
    if (std::optional<size_t> v = ReadLimitFile(root + dir + "/" + file); v.has_value()) {
      best = best.has_value() ? std::min(*best, *v) : *v;
    }
    if (dir.empty() || dir == "/") break;
    const size_t slash = dir.rfind('/');
    dir = slash == std::string::npos || slash == 0 ? "" : dir.substr(0, slash);
  }
  return best;
}

}  // namespace

size_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<size_t>(pages) * static_cast<size_t>(page);
}

std::optional<size_t> CgroupMemoryLimitBytes(const std::string& cgroup_root,
                                             const std::string& proc_self_cgroup) {
  std::ifstream in(proc_self_cgroup);
  std::string line, v2_path, v1_path;
  bool has_v1_memory = false;
  while (std::getline(in, line)) {
    // "hierarchy-id:controllers:path"; v2 is "0::/path".
    std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    if (parts[0] == "0" && parts[1].empty()) v2_path = parts[2];
    for (absl::string_view c : absl::StrSplit(parts[1], ',')) {
      if (c == "memory") {
        has_v1_memory = true;
        v1_path = parts[2];
      }
    }
  }
  if (has_v1_memory) {
    return SmallestOnPath(cgroup_root + "/memory", v1_path, "memory.limit_in_bytes");
  }
  return SmallestOnPath(cgroup_root, v2_path, "memory.max");
}

size_t ProcessResidentBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  if (n != 2) return 0;
  return static_cast<size_t>(resident) * static_cast<size_t>(sysconf(_SC_PAGE_SIZE));
}

size_t AvailableHostMemoryBytes() {
  size_t limit = PhysicalMemoryBytes();
  if (std::optional<size_t> cg = CgroupMemoryLimitBytes(); cg.has_value()) {
    limit = std::min(limit, *cg);
  }
  const size_t used = ProcessResidentBytes();
  return limit > used ? limit - used : 0;
}

}  // namespace dcf
