#include "engine/common/flag_names.h"

#include <cstring>

namespace dcf {

std::vector<char*> NormalizeFlagNames(int argc, char** argv, std::vector<std::string>& storage) {
  storage.assign(argv, argv + argc);
  bool flags_ended = false;
  for (int i = 1; i < argc; ++i) {
    std::string& arg = storage[i];
    if (flags_ended || arg.size() < 3 || arg[0] != '-') continue;
    if (arg == "--") {
      flags_ended = true;
      continue;
    }
    const size_t start = arg[1] == '-' ? 2 : 1;
    const size_t end = std::min(arg.find('='), arg.size());
    for (size_t j = start; j < end; ++j) {
      if (arg[j] == '-') arg[j] = '_';
    }
  }
  std::vector<char*> out;
  out.reserve(argc + 1);
  for (std::string& s : storage) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace dcf
