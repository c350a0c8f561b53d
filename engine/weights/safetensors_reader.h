// Reader for one .safetensors file (memory-mapped). Format: u64 little-endian header length,
// a JSON header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
// then the data region. Validated at open: header bounds, JSON, dtypes, every tensor's byte
// range inside the data region and equal to numel * dtype size, and the ranges tiling the data
// region as the format requires (sorted by offset, each begins where the one before ends; no
// overlap, no hole, nothing after the last tensor). Errors name the file and the tensor(s).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/weights/checkpoint.h"

namespace dcf {

absl::StatusOr<std::unique_ptr<CheckpointReader>> OpenSafetensors(const std::string& path);

}  // namespace dcf
