// The peak resident set of this process (VmHWM), and a reset of it to the current resident
// set (Linux: writing 5 to /proc/self/clear_refs), so that a test can bound what one call
// held at its peak: e.g. that a hostile config is refused before anything is built for it.
#pragma once

#include <cstddef>
#include <fstream>
#include <string>

namespace dcf::testing {

// False where the kernel does not allow the reset (then the peak is the whole process's).
inline bool ResetPeakResident() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return f.good();
}

// VmHWM in bytes; 0 when unknown.
inline size_t PeakResidentBytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

}  // namespace dcf::testing
