// The text of dcformer-loadgen's progress bar. The caller shows it only on a terminal
// (isatty), rewriting one line with '\r'; pipes and CI logs never see it. Pure function.
#pragma once

#include <string>

#include "absl/strings/string_view.h"
#include "bench/loadgen/run_result.h"

namespace dcf::loadgen {

// "c=8 [#########...........]  45/100 done, 8 in flight, 0 failed, 3.1 s, 912 tok/s":
// the bar fills with finished requests (or elapsed time when the run is duration-bound).
std::string ProgressLine(absl::string_view label, const RunProgress& progress, int bar_width = 24);

}  // namespace dcf::loadgen
