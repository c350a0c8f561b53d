#include "bench/loadgen/report.h"

#include <algorithm>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace dcf::loadgen {
namespace {

std::string CountsLine(const std::map<std::string, int64_t>& counts) {
  std::vector<std::string> parts;
  for (const auto& [name, n] : counts) parts.push_back(absl::StrCat(name, " ", n));
  return absl::StrJoin(parts, ", ");
}

nlohmann::ordered_json SummaryJson(const LatencySummary& s) {
  return {{"count", s.count}, {"mean", s.mean}, {"min", s.min}, {"p50", s.p50},
          {"p90", s.p90},     {"p99", s.p99},   {"max", s.max}};
}

std::string LatencyRow(const char* name, const LatencySummary& s) {
  if (s.count == 0) return absl::StrFormat("  %-6s %10s\n", name, "-");
  return absl::StrFormat("  %-6s %10.2f %10.2f %10.2f %10.2f %10.2f %10d\n", name, s.mean, s.p50,
                         s.p90, s.p99, s.max, s.count);
}

}  // namespace

std::string CountOf(int64_t n, absl::string_view noun) {
  return absl::StrCat(n, " ", noun, n == 1 ? "" : "s");
}

void PrintRun(std::ostream& out, const RunResult& run) {
  if (run.load.mode == LoadSpec::Mode::kClosed) {
    out << absl::StrFormat("closed loop, concurrency %d", run.load.concurrency);
  } else {
    out << absl::StrFormat(
        "open loop, Poisson %g requests/s (sent at %.2f/s, max send lag %.1f ms)", run.load.rate,
        run.sent_per_s, run.max_send_lag_ms);
  }
  out << absl::StrFormat(": %s (%d warm-up excluded), %d OK, %d failed, %.2f s%s\n",
                         CountOf(run.requests, "request"), run.warmup_requests, run.ok, run.failed,
                         run.duration_s, run.interrupted ? " (interrupted)" : "");
  out << absl::StrFormat(
      "  throughput %.2f requests/s, %.1f output tokens/s, %.1f input tokens/s\n",
      run.requests_per_s, run.output_tokens_per_s, run.input_tokens_per_s);
  out << absl::StrFormat("  %-6s %10s %10s %10s %10s %10s %10s\n", "ms", "mean", "p50", "p90",
                         "p99", "max", "n");
  out << LatencyRow("TTFT", run.ttft_ms);
  if (run.ttft_hit_ms.count > 0) {
    out << LatencyRow("  hit", run.ttft_hit_ms) << LatencyRow("  miss", run.ttft_miss_ms);
  }
  for (const auto& [turn, s] : run.ttft_ms_by_turn) {
    out << LatencyRow(absl::StrCat("  t", turn).c_str(), s);
  }
  out << LatencyRow("ITL", run.itl_ms) << LatencyRow("TPOT", run.tpot_ms)
      << LatencyRow("E2E", run.e2e_ms);
  out << absl::StrFormat("  tokens: %d input", run.input_tokens);
  if (run.cached_tokens > 0) {
    out << absl::StrFormat(" (%d prefix-cached, %.1f%%)", run.cached_tokens,
                           100.0 * static_cast<double>(run.cached_tokens) /
                               static_cast<double>(std::max<int64_t>(1, run.input_tokens)));
  }
  out << absl::StrFormat(", %d output (%d requested)", run.output_tokens,
                         run.requested_output_tokens);
  if (!run.finish_reasons.empty()) out << "; finish: " << CountsLine(run.finish_reasons);
  out << "\n";
  if (run.draft_tokens > 0) {
    out << absl::StrFormat("  speculation: %d drafted, %d accepted (acceptance rate %.1f%%)\n",
                           run.draft_tokens, run.accepted_draft_tokens,
                           100.0 * run.acceptance_rate);
  }
  if (!run.errors.empty()) {
    out << "  errors: " << CountsLine(run.errors) << "\n";
    for (const auto& [code, message] : run.error_examples) {
      out << "    " << code << " e.g.: " << message << "\n";
    }
  }
}

void PrintSweepSummary(std::ostream& out, const std::vector<RunResult>& runs) {
  out << absl::StrFormat("%-10s %8s %10s %10s %10s %10s %10s %10s %10s %7s\n", "load", "req/s",
                         "out tok/s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99", "E2E p50",
                         "E2E p99", "errors");
  for (const RunResult& r : runs) {
    out << absl::StrFormat("%-10s %8.2f %10.1f %10.2f %10.2f %10.2f %10.2f %10.2f %10.2f %7d\n",
                           r.load.Label(), r.requests_per_s, r.output_tokens_per_s, r.ttft_ms.p50,
                           r.ttft_ms.p99, r.itl_ms.p50, r.itl_ms.p99, r.e2e_ms.p50, r.e2e_ms.p99,
                           r.failed);
  }
  out << "(latencies in ms)\n";
}

nlohmann::ordered_json RunToJson(const RunResult& run) {
  const bool closed = run.load.mode == LoadSpec::Mode::kClosed;
  nlohmann::ordered_json j;
  j["mode"] = run.load.ModeName();
  j["concurrency"] =
      closed ? nlohmann::ordered_json(run.load.concurrency) : nlohmann::ordered_json(nullptr);
  j["rate"] = closed ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(run.load.rate);
  j["label"] = run.load.Label();
  j["interrupted"] = run.interrupted;
  j["duration_s"] = run.duration_s;
  j["requests"] = {{"warmup", run.warmup_requests},
                   {"sent", run.requests},
                   {"ok", run.ok},
                   {"failed", run.failed}};
  j["errors"] = nlohmann::ordered_json::object();
  for (const auto& [code, n] : run.errors) j["errors"][code] = n;
  j["error_examples"] = nlohmann::ordered_json::object();
  for (const auto& [code, message] : run.error_examples) j["error_examples"][code] = message;
  j["finish_reasons"] = nlohmann::ordered_json::object();
  for (const auto& [reason, n] : run.finish_reasons) j["finish_reasons"][reason] = n;
  j["tokens"] = {{"input", run.input_tokens},
                 {"cached", run.cached_tokens},
                 {"output", run.output_tokens},
                 {"requested_output", run.requested_output_tokens},
                 {"draft", run.draft_tokens},
                 {"accepted_draft", run.accepted_draft_tokens}};
  j["acceptance_rate"] = run.acceptance_rate;
  j["throughput"] = {{"requests_per_s", run.requests_per_s},
                     {"output_tokens_per_s", run.output_tokens_per_s},
                     {"input_tokens_per_s", run.input_tokens_per_s}};
  j["sent_per_s"] =
      closed ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(run.sent_per_s);
  j["max_send_lag_ms"] =
      closed ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(run.max_send_lag_ms);
  j["latency_ms"] = {{"ttft", SummaryJson(run.ttft_ms)},
                     {"itl", SummaryJson(run.itl_ms)},
                     {"tpot", SummaryJson(run.tpot_ms)},
                     {"e2e", SummaryJson(run.e2e_ms)},
                     {"ttft_prefix_hit", SummaryJson(run.ttft_hit_ms)},
                     {"ttft_prefix_miss", SummaryJson(run.ttft_miss_ms)}};
  if (run.ttft_ms_by_turn.empty()) {
    j["ttft_ms_by_turn"] = nullptr;
  } else {
    j["ttft_ms_by_turn"] = nlohmann::ordered_json::object();
    for (const auto& [turn, s] : run.ttft_ms_by_turn) {
      j["ttft_ms_by_turn"][std::to_string(turn)] = SummaryJson(s);
    }
  }
  return j;
}

absl::Status WriteJsonFile(const std::string& path, const nlohmann::ordered_json& doc) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (out) out << doc.dump(2) << "\n";
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("--json-out: cannot write '", path, "'"));
  return absl::OkStatus();
}

}  // namespace dcf::loadgen
