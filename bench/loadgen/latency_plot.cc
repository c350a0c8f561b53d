#include "bench/loadgen/latency_plot.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace dcf::loadgen {
namespace {

// A gnuplot single-quoted string literal (only '' is special inside one).
std::string Quote(const std::string& s) {
  return absl::StrCat("'", absl::StrReplaceAll(s, {{"'", "''"}, {"\n", " "}}), "'");
}

}  // namespace

absl::Status CheckGnuplot() {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "", ':')) {
    if (dir.empty()) continue;
    const std::string candidate = absl::StrCat(dir, "/gnuplot");
    if (access(candidate.c_str(), X_OK) == 0) return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      "--plot-out needs gnuplot, which is not on PATH (Debian: apt-get install gnuplot-nox; "
      "scripts/setup.sh installs it)");
}

absl::StatusOr<std::string> LatencyPlotScript(const std::string& png_path, const std::string& title,
                                              const std::vector<RunResult>& runs) {
  std::string data;
  for (const RunResult& r : runs) {
    if (r.ok == 0) continue;
    absl::StrAppendFormat(&data, "%.6g %.6g %.6g %.6g %.6g %.6g %.6g \"%s\"\n",
                          r.output_tokens_per_s, r.ttft_ms.p50, r.ttft_ms.p99, r.itl_ms.p50,
                          r.itl_ms.p99, r.e2e_ms.p50, r.e2e_ms.p99, r.load.Label());
  }
  if (data.empty()) {
    return absl::InvalidArgumentError("--plot-out: no run has a successful request to plot");
  }
  std::string s;
  absl::StrAppend(&s, "set terminal pngcairo noenhanced size 1500,520 font ',10'\n", "set output ",
                  Quote(png_path), "\n", "$runs << EOD\n", data, "EOD\n",
                  "set multiplot layout 1,3 title ", Quote(title), "\n",
                  "set xlabel 'output tokens/s'\nset ylabel 'ms'\nset grid\n",
                  "set key top left\nset yrange [0:*]\nset offsets graph 0.05, graph 0.05, "
                  "graph 0.1, 0\n");
  const struct {
    const char* name;
    int p50_column;
  } panels[] = {{"time to first token", 2}, {"inter-token latency", 4}, {"end-to-end latency", 6}};
  for (const auto& panel : panels) {
    absl::StrAppendFormat(&s,
                          "set title '%s'\n"
                          "plot $runs using 1:%d with linespoints pt 7 title 'p50', "
                          "$runs using 1:%d with linespoints pt 5 title 'p99', "
                          "$runs using 1:%d:8 with labels offset 0,1 font ',8' notitle\n",
                          panel.name, panel.p50_column, panel.p50_column + 1, panel.p50_column + 1);
  }
  absl::StrAppend(&s, "unset multiplot\nset output\n");
  return s;
}

absl::Status WriteLatencyPlot(const std::string& png_path, const std::string& title,
                              const std::vector<RunResult>& runs) {
  absl::StatusOr<std::string> script = LatencyPlotScript(png_path, title, runs);
  if (!script.ok()) return script.status();
  std::remove(png_path.c_str());  // so that a stale file never passes for a new plot
  FILE* gnuplot = popen("gnuplot", "w");
  if (gnuplot == nullptr) return absl::InternalError("--plot-out: cannot start gnuplot");
  const bool written = std::fwrite(script->data(), 1, script->size(), gnuplot) == script->size();
  const int status = pclose(gnuplot);
  struct stat st;
  if (!written || status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
      stat(png_path.c_str(), &st) != 0 || st.st_size == 0) {
    return absl::InternalError(absl::StrCat("--plot-out: gnuplot failed to write '", png_path,
                                            "' (its messages are above)"));
  }
  return absl::OkStatus();
}

}  // namespace dcf::loadgen
