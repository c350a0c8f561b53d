// What Engine::Create (engine.h) decides before the engine loop starts, from the options, the
// model and the backend's answers: the options checked, the speculation and the pipelining in
// effect, the step limits the backend is prepared for, and the KV cache's shape within its
// budget. The speculation and pipelining resolution and the cache planning log what they
// turn off or leave unused (INFO / WARN). Called once, on the thread that creates the engine;
// a bad option is InvalidArgument naming it, and the cache planning passes on
// PlanKvCache's errors (ResourceExhausted when the budget holds too little).
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/execution/backend.h"
#include "engine/serving/engine.h"

namespace dcf::engine_internal {

// The options' own ranges (block size, batch and queue limits, watermark, new-token default,
// speculation bounds).
absl::Status ValidateEngineOptions(const EngineOptions& options);

// `options` (validated) with the speculation and the pipelining in effect on `backend`:
// speculation off where the backend cannot verify drafts or the step token budget is 1,
// capped by the window rule, its per-step limits defaulted; pipelined steps only where the
// backend chains them (and, on kAuto, where its Launch returns early). Runs the backend's
// MeasureMemoryBoundTokens when speculation is on and spec_step_tokens is 0;
// `*step_tokens_source` says where spec_step_tokens came from: "given", "measured" or "not
// measured".
EngineOptions ResolveEngineOptions(const EngineOptions& options, Backend& backend,
                                   std::string* step_tokens_source);

// The step limits the engine prepares the backend for (Backend::Prepare) under `resolved`.
StepLimits EngineStepLimits(const EngineOptions& resolved, const ModelConfig& config);

// The KV cache's shape: options.kv_num_blocks when given (both groups > 0), else planned
// (PlanKvCache) within kv_cache_bytes, or kv_cache_fraction of the `available` bytes
// Backend::Prepare reported, for limits.max_seqs sequences; says in the log when the plan
// stays below its budget by a block or more.
absl::StatusOr<KvCacheShape> PlanEngineKvCache(const EngineOptions& options, const Backend& backend,
                                               const StepLimits& limits, size_t available);

}  // namespace dcf::engine_internal
