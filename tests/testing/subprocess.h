// Runs a command through /bin/sh and captures its stdout, stderr and exit code.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/testing/temp_dir.h"

namespace dcf::testing {

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

inline CommandResult RunCommand(const std::string& command, const std::string& stdin_text = "") {
  TempDir dir;
  dir.Write("stdin", stdin_text);
  const std::string full = command + " < " + dir.File("stdin") + " > " + dir.File("stdout") +
                           " 2> " + dir.File("stderr");
  CommandResult r;
  const int status = std::system(full.c_str());
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = dir.Read("stdout");
  r.err = dir.Read("stderr");
  return r;
}

}  // namespace dcf::testing
