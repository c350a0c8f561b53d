#include "engine/common/flag_names.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>

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
const absl::CommandLineFlag* FindFlag(const std::string& name) {
  if (const absl::CommandLineFlag* f = absl::FindCommandLineFlag(name)) return f;
  if (name.rfind("no", 0) == 0) {
    const absl::CommandLineFlag* f = absl::FindCommandLineFlag(name.substr(2));
    if (f != nullptr && f->IsOfType<bool>()) return f;
  }
  return nullptr;
}

// "--max-new-tokens" for "max_new_tokens", as users type it.
std::string Dashed(std::string name) {
  std::replace(name.begin(), name.end(), '_', '-');
  return "--" + name;
}

std::string Underscored(std::string name) {
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

// Flagfiles may name further flagfiles; absl stops such chains too.
constexpr int kMaxFlagfileDepth = 8;

class Tokenizer {
 public:
  explicit Tokenizer(const BareFlagValues& bare_values) : bare_values_(bare_values) {}

  // `words` come from `where` ("" for the command line, else a flagfile's path).
  absl::Status Read(const std::vector<std::string>& words, const std::string& where,
                    int depth) {
    const std::string prefix = where.empty() ? "" : absl::StrCat(where, ": ");
    auto error = [&prefix](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat(prefix, what));
    };
    for (size_t i = 0; i < words.size(); ++i) {
      const std::string& word = words[i];
      if (word == "--" && where.empty()) {
        line_.positional.insert(line_.positional.end(), words.begin() + i + 1, words.end());
        break;
      }
      if (word.size() < 2 || word[0] != '-') {
        if (where.empty()) {
          line_.positional.push_back(word);
          continue;
        }
        return error(absl::StrCat("'", word, "' is not a flag (one --name=value per line)"));
      }
      const size_t start = word[1] == '-' ? 2 : 1;
      const size_t eq = word.find('=');
      FlagArg arg;
      arg.name = Underscored(word.substr(start, std::min(eq, word.size()) - start));
      arg.has_value = eq != std::string::npos;
      if (arg.has_value) arg.value = word.substr(eq + 1);
      arg.where = where;
      const bool next_exists = i + 1 < words.size();
      // The flags Abseil's parser handles itself, each taking a value.
      if (arg.name == "flagfile" || arg.name == "fromenv" || arg.name == "tryfromenv" ||
          arg.name == "undefok") {
        if (!arg.has_value) {
          if (!next_exists) return error(Dashed(arg.name) + " needs a value");
          arg.value = words[++i];
        }
        if (arg.name == "flagfile") {
          RETURN_IF_ERROR(ReadFlagfiles(arg.value, depth));
        } else if (arg.name == "undefok") {
          for (absl::string_view n : absl::StrSplit(arg.value, ',', absl::SkipEmpty())) {
            line_.undefok.insert(Underscored(std::string(n)));
          }
        } else {
          RETURN_IF_ERROR(ReadEnvironment(arg.value, arg.name == "fromenv"));
        }
        continue;
      }
      if (arg.name == "help" || arg.name == "h" || arg.name == "helpshort" ||
          arg.name == "helppackage") {
        line_.help = true;
        continue;
      }
      if (arg.name == "helpfull") {
        line_.helpfull = true;
        continue;
      }
      // Abseil's other usage flags (--helpon=x, --helpmatch=x, --version, --only_check_args).
      if (arg.name.rfind("help", 0) == 0 || arg.name == "version" ||
          arg.name == "only_check_args") {
        line_.absl_usage.push_back(word);
        continue;
      }
      arg.flag = FindFlag(arg.name);
      if (arg.flag != nullptr && !arg.has_value && !arg.flag->IsOfType<bool>()) {
        const auto bare = std::find_if(bare_values_.begin(), bare_values_.end(),
                                       [&arg](const auto& b) { return b.first == arg.name; });
        if (bare != bare_values_.end()) {
          // "--wait-ready 2s": the next word when it is a value of the flag, else the bare value.
          std::string parse_error;
          absl::CommandLineFlag* flag = absl::FindCommandLineFlag(arg.name);
          if (where.empty() && next_exists && !words[i + 1].empty() && words[i + 1][0] != '-' &&
              flag->ParseFrom(words[i + 1], &parse_error)) {
            arg.value = words[++i];
          } else {
            arg.value = bare->second;
          }
          arg.has_value = true;
        } else if (next_exists) {
          arg.value = words[++i];  // "--prompt -h": the word after it is its value
          arg.has_value = true;
        }
      }
      line_.flags.push_back(std::move(arg));
    }
    return absl::OkStatus();
  }

  CommandLine Take() { return std::move(line_); }

 private:
  // Reads the comma-separated flagfiles `files` once each, tokenizing their lines in place.
  absl::Status ReadFlagfiles(const std::string& files, int depth) {
    if (depth + 1 >= kMaxFlagfileDepth) {
      return absl::InvalidArgumentError("--flagfile: flagfiles nested too deeply");
    }
    for (absl::string_view file : absl::StrSplit(files, ',', absl::SkipEmpty())) {
      absl::StatusOr<std::string> text = ReadFileToString(std::string(file));
      if (!text.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("--flagfile: ", text.status().message()));
      }
      std::vector<std::string> lines;
      for (absl::string_view l : absl::StrSplit(*text, '\n')) {
        l = absl::StripAsciiWhitespace(l);
        if (l.empty() || l[0] == '#') continue;
        lines.emplace_back(l);
      }
      RETURN_IF_ERROR(Read(lines, std::string(file), depth + 1));
    }
    return absl::OkStatus();
  }

  // --fromenv=a,b: FLAGS_a and FLAGS_b set the flags (absl's rule); `required`: must be set.
  absl::Status ReadEnvironment(const std::string& names, bool required) {
    for (absl::string_view n : absl::StrSplit(names, ',', absl::SkipEmpty())) {
      const std::string name = Underscored(std::string(n));
      const std::string variable = "FLAGS_" + name;
      const char* value = std::getenv(variable.c_str());
      if (value == nullptr) {
        if (!required) continue;
        return absl::InvalidArgumentError(
            absl::StrCat("--fromenv: ", variable, " is not set in the environment"));
      }
      FlagArg arg;
      arg.name = name;
      arg.flag = FindFlag(name);
      arg.has_value = true;
      arg.value = value;
      arg.where = variable;
      line_.flags.push_back(std::move(arg));
    }
    return absl::OkStatus();
  }

  const BareFlagValues& bare_values_;
  CommandLine line_;
};

// Flags Abseil defines itself (--flagfile, --helpfull, ...): their files are Abseil's.
bool IsAbslFlag(const absl::CommandLineFlag& flag) {
  return absl::StrContains(flag.Filename(), "absl/");
}

bool Undefok(const CommandLine& line, const std::string& name) {
  return line.undefok.contains(name) ||
         (name.rfind("no", 0) == 0 && line.undefok.contains(name.substr(2)));
}

std::string BaseName(absl::string_view path) {
  const size_t slash = path.rfind('/');
  return std::string(slash == absl::string_view::npos ? path : path.substr(slash + 1));
}

}  // namespace

absl::StatusOr<CommandLine> ReadCommandLine(int argc, char** argv,
                                            const BareFlagValues& bare_values) {
  std::vector<std::string> words;
  for (int i = 1; i < argc && argv[i] != nullptr; ++i) words.emplace_back(argv[i]);
  Tokenizer tokenizer(bare_values);
  RETURN_IF_ERROR(tokenizer.Read(words, "", 0));
  return tokenizer.Take();
}

absl::Status CheckCommandLine(const CommandLine& line) {
  for (const FlagArg& arg : line.flags) {
    auto error = [&arg](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat(arg.where.empty() ? "" : absl::StrCat(arg.where, ": "), what));
    };
    const std::string name = Dashed(arg.name);
    if (arg.flag == nullptr) {
      if (Undefok(line, arg.name)) continue;
      return error("unknown flag " + name);
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(arg.flag->Name());
    if (flag->IsOfType<bool>()) {
      if (!arg.has_value) continue;
      if (arg.name != flag->Name()) return error(name + " takes no value");
    } else if (!arg.has_value) {
      return error(name + " needs a value");
    }
    std::string parse_error;
    if (!flag->ParseFrom(arg.value, &parse_error)) {
      return error(absl::StrCat(name, ": ", parse_error));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckFlagArgs(int argc, char** argv) {
  ASSIGN_OR_RETURN(CommandLine line, ReadCommandLine(argc, argv));
  return CheckCommandLine(line);
}

absl::flat_hash_set<std::string> GivenFlagNames(const CommandLine& line) {
  absl::flat_hash_set<std::string> given;
  for (const FlagArg& arg : line.flags) {
    if (arg.flag == nullptr) continue;
    given.insert(arg.name);
    given.insert(std::string(arg.flag->Name()));  // "noX" also records X
  }
  return given;
}

std::vector<std::string> AbslArgs(absl::string_view program, const CommandLine& line) {
  std::vector<std::string> args = {std::string(program)};
  for (const FlagArg& arg : line.flags) {
    if (arg.flag == nullptr && Undefok(line, arg.name)) continue;
    args.push_back(arg.has_value ? absl::StrCat("--", arg.name, "=", arg.value)
                                 : absl::StrCat("--", arg.name));
  }
  args.insert(args.end(), line.absl_usage.begin(), line.absl_usage.end());
  args.push_back("--");
  args.insert(args.end(), line.positional.begin(), line.positional.end());
  return args;
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
  auto fail = [&program](const absl::Status& s) {
    std::cerr << program << ": " << s.message() << " (--help lists the flags)\n";
    std::exit(2);
  };
  absl::StatusOr<CommandLine> line = ReadCommandLine(argc, argv, bare_values);
  if (!line.ok()) fail(line.status());
  if (line->help || line->helpfull) {
    std::cout << ToolHelp(program, usage, line->helpfull) << std::flush;
    std::exit(0);
  }
  if (absl::Status s = CheckCommandLine(*line); !s.ok()) fail(s);
  if (given != nullptr) *given = GivenFlagNames(*line);
  storage = AbslArgs(argc > 0 ? argv[0] : "", *line);
  std::vector<char*> args;
  for (std::string& arg : storage) args.push_back(arg.data());
  args.push_back(nullptr);
  return absl::ParseCommandLine(static_cast<int>(storage.size()), args.data());
}

}  // namespace dcf
