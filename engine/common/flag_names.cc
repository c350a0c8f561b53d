#include "engine/common/flag_names.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "engine/common/file_util.h"
#include "engine/common/status_macros.h"

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

namespace {

// Flagfiles may name further flagfiles; absl stops such chains too.
constexpr int kMaxFlagfileDepth = 8;

absl::Status CheckArgs(const std::vector<std::string>& args, absl::string_view where, int depth);

// Checks the lines of the comma-separated flagfiles `files` as absl reads them: one flag per
// line, `#` comments and blank lines skipped, names spelled with underscores.
absl::Status CheckFlagfiles(const std::string& files, int depth) {
  if (depth >= kMaxFlagfileDepth) {
    return absl::InvalidArgumentError("--flagfile: flagfiles nested too deeply");
  }
  for (absl::string_view file : absl::StrSplit(files, ',', absl::SkipEmpty())) {
    absl::StatusOr<std::string> text = ReadFileToString(std::string(file));
    if (!text.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--flagfile: ", text.status().message()));
    }
    std::vector<std::string> lines;
    for (absl::string_view line : absl::StrSplit(*text, '\n')) {
      line = absl::StripAsciiWhitespace(line);
      if (line.empty() || line[0] == '#') continue;
      lines.emplace_back(line);
    }
    RETURN_IF_ERROR(CheckArgs(lines, file, depth + 1));
  }
  return absl::OkStatus();
}

// `args` are the arguments after the program name; `where` is empty for the command line, the
// flagfile's path for its lines (which must all be flags).
absl::Status CheckArgs(const std::vector<std::string>& args, absl::string_view where, int depth) {
  const std::string prefix = where.empty() ? "" : absl::StrCat(where, ": ");
  auto error = [&prefix](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, what));
  };
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--" && where.empty()) break;
    if (arg.size() < 2 || arg[0] != '-') {
      if (where.empty()) continue;  // a positional argument
      return error(absl::StrCat("'", arg, "' is not a flag (one --name=value per line)"));
    }
    const size_t start = arg[1] == '-' ? 2 : 1;
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(start, std::min(eq, arg.size()) - start);
    const bool has_value = eq != std::string::npos;
    const bool next_is_value = !has_value && where.empty() && i + 1 < args.size();
    if (name == "flagfile") {
      if (!has_value && !next_is_value) return error("--flagfile needs a value");
      RETURN_IF_ERROR(CheckFlagfiles(has_value ? arg.substr(eq + 1) : args[++i], depth));
      continue;
    }
    if (name == "fromenv" || name == "tryfromenv" || name == "undefok") {
      if (next_is_value) ++i;
      continue;
    }
    // absl's usage flags (--help, --helpfull, --helpon=x, --version, ...): absl handles them.
    if (name.rfind("help", 0) == 0 || name == "version" || name == "only_check_args") continue;
    absl::CommandLineFlag* flag = FindFlag(name);
    if (flag == nullptr) {
      std::string underscored = name;
      std::replace(underscored.begin(), underscored.end(), '-', '_');
      if (!where.empty() && underscored != name && FindFlag(underscored) != nullptr) {
        return error(absl::StrCat("unknown flag --", name,
                                  " (flagfiles spell flag names with underscores: --", underscored,
                                  ")"));
      }
      return error("unknown flag " + Dashed(name));
    }
    std::string value;
    if (flag->IsOfType<bool>()) {
      if (!has_value) continue;
      if (name != flag->Name()) return error(Dashed(name) + " takes no value");
      value = arg.substr(eq + 1);
    } else if (has_value) {
      value = arg.substr(eq + 1);
    } else if (next_is_value) {
      value = args[++i];
    } else {
      return error(Dashed(name) + " needs a value");
    }
    std::string parse_error;
    if (!flag->ParseFrom(value, &parse_error)) {
      return error(absl::StrCat(Dashed(name), ": ", parse_error));
    }
  }
  return absl::OkStatus();
}

// Flags Abseil defines itself (--flagfile, --helpfull, ...): their files are Abseil's.
bool IsAbslFlag(const absl::CommandLineFlag& flag) {
  return absl::StrContains(flag.Filename(), "absl/");
}

std::string BaseName(absl::string_view path) {
  const size_t slash = path.rfind('/');
  return std::string(slash == absl::string_view::npos ? path : path.substr(slash + 1));
}

}  // namespace

absl::Status CheckFlagArgs(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc && argv[i] != nullptr; ++i) args.emplace_back(argv[i]);
  return CheckArgs(args, "", 0);
}

std::string ToolHelp(absl::string_view program, absl::string_view usage, bool include_absl) {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (flag->IsRetired() || (!include_absl && IsAbslFlag(*flag))) continue;
    flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  std::string out = absl::StrCat(program, ": ", usage,
                                 "\n\nFlags (dashes or underscores; "
                                 "--flag=value or --flag value; --noflag for a false boolean):\n");
  for (const absl::CommandLineFlag* flag : flags) {
    const std::string name = Dashed(std::string(flag->Name()));
    const std::string shown_default = flag->IsOfType<std::string>()
                                          ? absl::StrCat("\"", flag->DefaultValue(), "\"")
                                          : flag->DefaultValue();
    absl::StrAppend(&out, "  ", name, " (default ", shown_default, ")\n      ", flag->Help(), "\n");
  }
  if (!include_absl) {
    absl::StrAppend(&out, "\n--helpfull also lists Abseil's own flags (--flagfile, ...).\n");
  }
  return out;
}

std::vector<char*> ParseToolCommandLine(int argc, char** argv, absl::string_view usage,
                                        std::vector<std::string>& storage,
                                        absl::flat_hash_set<std::string>* given,
                                        const BareFlagValues& bare_values) {
  const std::string program = BaseName(argc > 0 ? argv[0] : "");
  absl::SetProgramUsageMessage(usage);
  // "--wait-ready" alone: "--wait_ready=<its bare value>" (values of other flags stay as typed).
  std::vector<std::string> expanded(argv, argv + argc);
  for (int i = 1; i < argc && !bare_values.empty(); ++i) {
    std::string& arg = expanded[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-' || arg.find('=') != std::string::npos) continue;
    std::string name = arg.substr(arg[1] == '-' ? 2 : 1);
    std::replace(name.begin(), name.end(), '-', '_');
    const auto bare = std::find_if(bare_values.begin(), bare_values.end(),
                                   [&name](const auto& b) { return b.first == name; });
    if (bare != bare_values.end()) {
      arg = absl::StrCat("--", name, "=", bare->second);
      continue;
    }
    const absl::CommandLineFlag* flag = FindFlag(name);
    if (flag != nullptr && !flag->IsOfType<bool>()) ++i;  // its value follows
  }
  std::vector<char*> expanded_argv;
  for (std::string& arg : expanded) expanded_argv.push_back(arg.data());
  expanded_argv.push_back(nullptr);
  std::vector<char*> args = NormalizeFlagNames(argc, expanded_argv.data(), storage);
  for (int i = 1; i < argc; ++i) {
    const std::string arg = args[i];
    if (arg == "--") break;
    if (arg == "--help" || arg == "-help" || arg == "-h" || arg == "--helpfull" ||
        arg == "-helpfull") {
      std::cout << ToolHelp(program, usage, absl::EndsWith(arg, "full")) << std::flush;
      std::exit(0);
    }
    // "--prompt -h": the word after a flag that takes a value is that value.
    if (arg.size() > 1 && arg[0] == '-' && arg.find('=') == std::string::npos) {
      const absl::CommandLineFlag* flag = FindFlag(arg.substr(arg[1] == '-' ? 2 : 1));
      if (flag != nullptr && !flag->IsOfType<bool>()) ++i;
    }
  }
  if (absl::Status s = CheckFlagArgs(argc, args.data()); !s.ok()) {
    std::cerr << program << ": " << s.message() << " (--help lists the flags)\n";
    std::exit(2);
  }
  if (given != nullptr) *given = GivenFlagNames(argc, args.data());
  return absl::ParseCommandLine(argc, args.data());
}

}  // namespace dcf
