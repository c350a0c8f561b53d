// The --backend, --dtype, --kv-cache-dtype, --check-weights, --weight-dtype, --weight-group-size
// and --activation-dtype flags, shared by dcformer-server,
// dcformer-generate and the benchmarks (so they spell and document them alike). A separate
// library from the factory: the inference library itself defines no flags.
#pragma once

#include "absl/status/statusor.h"
#include "engine/execution/backend_options.h"

namespace dcf {

// BackendOptions from those flags; InvalidArgument naming the flag
// otherwise.
absl::StatusOr<BackendOptions> BackendOptionsFromFlags();

}  // namespace dcf
