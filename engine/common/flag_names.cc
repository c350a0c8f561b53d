#include "engine/common/flag_names.h"

#include <algorithm>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"

namespace dcf {
namespace {

// The registered flag `name` (or, for "noX", the boolean flag X), or null.
absl::CommandLineFlag* FindFlag(const std::string& name) {
  if (absl::CommandLineFlag* f = absl::FindCommandLineFlag(name)) return f;
  if (name.rfind("no", 0) == 0) {
    absl::CommandLineFlag* f = absl::FindCommandLineFlag(name.substr(2));
    if (f != nullptr && f->IsOfType<bool>()) return f;
  }
  return nullptr;
}

// "--max-new-tokens" for "max_new_tokens", as users type it.
std::string Dashed(std::string name) {
  std::replace(name.begin(), name.end(), '_', '-');
  return "--" + name;
}

}  // namespace

std::vector<char*> NormalizeFlagNames(int argc, char** argv, std::vector<std::string>& storage) {
  storage.assign(argv, argv + argc);
  for (int i = 1; i < argc; ++i) {
    std::string& arg = storage[i];
    if (arg == "--") break;  // everything after it is positional
    if (arg.size() < 2 || arg[0] != '-') continue;
    const size_t start = arg[1] == '-' ? 2 : 1;
    const size_t eq = arg.find('=');
    const size_t end = std::min(eq, arg.size());
    std::string name = arg.substr(start, end - start);
    std::replace(name.begin(), name.end(), '-', '_');
    // Only names of registered flags are rewritten: a value such as "--prompt -a-b" or an
    // unknown flag (reported by the parser under its own spelling) stays as typed.
    const absl::CommandLineFlag* flag = FindFlag(name);
    if (flag == nullptr) continue;
    arg.replace(start, end - start, name);
    // "--flag value": the next argument is the value; never treat it as a flag.
    if (eq == std::string::npos && !flag->IsOfType<bool>()) ++i;
  }
  std::vector<char*> out;
  out.reserve(argc + 1);
  for (std::string& s : storage) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

absl::flat_hash_set<std::string> GivenFlagNames(int argc, char** argv) {
  absl::flat_hash_set<std::string> given;
  for (int i = 1; i < argc && argv[i] != nullptr; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    const size_t start = arg[1] == '-' ? 2 : 1;
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(start, std::min(eq, arg.size()) - start);
    const absl::CommandLineFlag* flag = FindFlag(name);
    if (flag == nullptr) continue;
    given.insert(name);
    if (name != flag->Name()) given.insert(std::string(flag->Name()));  // "noX" also records X
    if (eq == std::string::npos && !flag->IsOfType<bool>()) ++i;        // skip the value
  }
  return given;
}

absl::Status CheckFlagArgs(int argc, char** argv) {
  for (int i = 1; i < argc && argv[i] != nullptr; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    const size_t start = arg[1] == '-' ? 2 : 1;
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(start, std::min(eq, arg.size()) - start);
    if (name == "flagfile" || name == "fromenv" || name == "tryfromenv" || name == "undefok") {
      if (eq == std::string::npos) ++i;
      continue;
    }
    // absl's usage flags (--help, --helpfull, --helpon=x, --version, ...): absl handles them.
    if (name.rfind("help", 0) == 0 || name == "version" || name == "only_check_args") continue;
    absl::CommandLineFlag* flag = FindFlag(name);
    if (flag == nullptr) return absl::InvalidArgumentError("unknown flag " + Dashed(name));
    std::string value;
    if (flag->IsOfType<bool>()) {
      if (eq == std::string::npos) continue;
      if (name != flag->Name()) {
        return absl::InvalidArgumentError(Dashed(name) + " takes no value");
      }
      value = arg.substr(eq + 1);
    } else if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < argc && argv[i + 1] != nullptr) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(Dashed(name) + " needs a value");
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat(Dashed(name), ": ", error));
    }
  }
  return absl::OkStatus();
}

}  // namespace dcf
