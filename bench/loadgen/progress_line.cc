#include "bench/loadgen/progress_line.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dcf::loadgen {

std::string ProgressLine(absl::string_view label, const RunProgress& p, int bar_width) {
  double fraction = 0;
  std::string count;
  if (p.total > 0) {
    fraction = static_cast<double>(p.finished) / static_cast<double>(p.total);
    count = absl::StrFormat("%d/%d done", p.finished, p.total);
  } else {
    fraction = p.duration_s > 0 ? p.elapsed_s / p.duration_s : 0;
    count = absl::StrFormat("%d done", p.finished);
  }
  fraction = std::clamp(fraction, 0.0, 1.0);
  const int filled = static_cast<int>(fraction * bar_width + 0.5);
  const double tokens_per_s =
      p.elapsed_s > 0 ? static_cast<double>(p.output_tokens) / p.elapsed_s : 0;
  return absl::StrFormat("%s [%s%s] %s, %d in flight, %d failed, %.1f s, %.0f tok/s", label,
                         std::string(filled, '#'), std::string(bar_width - filled, '.'), count,
                         p.in_flight, p.failed, p.elapsed_s, tokens_per_s);
}

}  // namespace dcf::loadgen
