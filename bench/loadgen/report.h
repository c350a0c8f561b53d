// dcformer-loadgen's reports of finished runs: the human-readable table (stdout) and the
// JSON document (--json-out). The JSON schema is documented in bench/README.md; keep the two
// in step (schema_version changes when a field changes meaning or disappears).
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "bench/loadgen/run_result.h"
#include "nlohmann/json.hpp"

namespace dcf::loadgen {

inline constexpr int kJsonSchemaVersion = 1;

// "1 request", "2 requests": `n` and the noun, plural unless n is 1 (nouns that take an "s").
std::string CountOf(int64_t n, absl::string_view noun);

// One run as a block: load, counts, throughput, latency table, finish reasons, errors.
void PrintRun(std::ostream& out, const RunResult& run);
// One line per run (when a sweep has several).
void PrintSweepSummary(std::ostream& out, const std::vector<RunResult>& runs);

// The run's object in the JSON document's "runs" array.
nlohmann::ordered_json RunToJson(const RunResult& run);

// Writes `doc` (pretty-printed) to `path`; Internal error naming the path when it cannot.
absl::Status WriteJsonFile(const std::string& path, const nlohmann::ordered_json& doc);

}  // namespace dcf::loadgen
