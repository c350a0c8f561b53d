// dcformer-loadgen's reports of finished runs: the human-readable table (stdout) and the
// JSON document (--json-out). The JSON schema is documented in bench/README.md; keep the two
// in step (schema_version changes when a field changes meaning or disappears).
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/loadgen/run_result.h"
#include "nlohmann/json.hpp"

namespace dcf::loadgen {

inline constexpr int kJsonSchemaVersion = 1;

// One run as a block: load, counts, throughput, latency table, finish reasons, errors.
void PrintRun(std::ostream& out, const RunResult& run);
// One line per run (when a sweep has several).
void PrintSweepSummary(std::ostream& out, const std::vector<RunResult>& runs);

// The run's object in the JSON document's "runs" array.
nlohmann::ordered_json RunToJson(const RunResult& run);

// Writes `doc` (pretty-printed) to `path`; Internal error naming the path when it cannot.
absl::Status WriteJsonFile(const std::string& path, const nlohmann::ordered_json& doc);

}  // namespace dcf::loadgen
