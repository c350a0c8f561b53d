// The sweep plot of dcformer-loadgen (--plot-out): latency against throughput, one point per
// run, drawn by gnuplot (Debian's gnuplot-nox, pngcairo terminal) as a PNG of three panels,
// TTFT, inter-token latency and end-to-end latency (p50 and p99, ms) against output tokens/s,
// each point labelled with its load (c=8, 2/s).
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/loadgen/run_result.h"

namespace dcf::loadgen {

// OK when a `gnuplot` executable is on PATH; FailedPrecondition saying what to install.
absl::Status CheckGnuplot();

// The gnuplot script that draws `runs` (those with OK requests) into `png_path`.
// InvalidArgument when no run has an OK request.
absl::StatusOr<std::string> LatencyPlotScript(const std::string& png_path, const std::string& title,
                                              const std::vector<RunResult>& runs);

// Runs gnuplot on LatencyPlotScript; Internal when gnuplot fails or writes no file.
absl::Status WriteLatencyPlot(const std::string& png_path, const std::string& title,
                              const std::vector<RunResult>& runs);

}  // namespace dcf::loadgen
