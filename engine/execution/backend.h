// The model-execution interface every backend (cpu, cuda, cuda-sim) implements.
//
// Lifecycle (one owner thread, e.g. the engine loop; no method may run concurrently with
// another):
//   1. Prepare(limits): allocates the per-step workspace for the largest step and reports
//      the memory left for the KV cache.
//   2. AllocateCache(shape): the paged KV cache (both layer groups).
//   3. Per step: Launch(batch) then Wait(&out). Launch may return before the device is done
//      (the caller may prepare the next batch meanwhile); `batch` must stay alive and
//      unchanged until Wait returns. Step() does both (with no other step in flight).
//      A backend that ChainsSteps() takes a second Launch before the first step's Wait: at
//      most 2 steps are in flight, each Wait completes the oldest, and the second step may
//      take tokens the first is still sampling (chained tokens, step_batch.h). A step that
//      returns logits must be waited for before the next Launch.
//   SetPenaltyState(slot, ...) between steps (also with steps in flight: it applies after
//   them), for sequences whose penalties need counts.
//
// See step_batch.h for what a step reads and writes (including the window rule), and
// step_plan.h for the host-side rules every backend applies the same way (limits and cache
// checks, bytes per block, which rows get logits, where results go, RoPE angles).
//
// Errors: InvalidArgument / OutOfRange / FailedPrecondition for a malformed batch (nothing
// is written to the cache then). Any other error from Launch/Wait is a backend failure: the
// backend may be unusable afterwards (e.g. a sticky CUDA fault), and health() reports it.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/kv/kv_cache_manager.h"
#include "engine/model/model_config.h"
#include "engine/execution/backend_options.h"
#include "engine/execution/step_batch.h"
#include "engine/weights/dtype.h"

namespace dcf {

// What a backend is, for logs and GetModelInfo.
struct BackendInfo {
  std::string name;          // "cpu", "cuda", "cuda-sim"
  std::string device;        // e.g. "NVIDIA H200", or the CPU model name
  DType dtype = DType::kF32; // the dtype weights are kept and multiplied in
  // > 0: the matrices are int8 with one scale per this many columns (docs/QUANTIZATION.md);
  // `dtype` is then that of the rest (vectors, embeddings).
  int int8_weight_group = 0;
  // With int8 matrices: the products quantize their activations to int8 too (int8 x int8).
  bool int8_activations = false;
  // kInt8 / kFp8: the matrices are int8 or fp8 E4M3 with one fp32 scale per output channel
  // (the cuda backends' --weight-dtype; docs/QUANTIZATION.md "GPU"), `dtype` that of the
  // rest; kNone otherwise.
  WeightQuant channel_quant = WeightQuant::kNone;
  // With fp8 matrices: products of more than 16 rows quantize their activations to fp8 too.
  bool fp8_activations = false;
  DType kv_cache_dtype = DType::kF32;  // the dtype of the KV cache's elements
};

// How the weight matrices are stored, for logs and benchmarks: the dtype's name
// ("bfloat16"), "int8 (group 64)", "int8 x int8 (group 64)", "int8 (per channel)",
// "fp8 (per channel)" or "fp8 x fp8 (per channel)".
std::string WeightsName(const BackendInfo& info);

class Backend {
 public:
  virtual ~Backend() = default;

  virtual const ModelConfig& config() const = 0;
  virtual BackendInfo info() const = 0;
  // Bytes of cache memory one block of group `g` takes (all layers of that group).
  virtual size_t BytesPerBlock(LayerGroup g, int block_size) const = 0;

  // Allocates the per-step workspace for steps within `limits` (replacing an earlier one)
  // and returns the bytes of memory still available for the KV cache: free device memory
  // on a GPU; on the CPU the smaller of physical memory and the cgroup memory limit, minus
  // what the process already uses. ResourceExhausted when the workspace does not fit.
  virtual absl::StatusOr<size_t> Prepare(const StepLimits& limits) = 0;

  // Allocates cache storage for `shape` (discarding any previous cache). Needs Prepare.
  virtual absl::Status AllocateCache(const KvCacheShape& shape) = 0;

  // Resets penalty slot `slot` (< limits.num_penalty_slots) to a sequence with this prompt
  // and these generated tokens. Afterwards the backend records every token it samples for a
  // row naming the slot.
  virtual absl::Status SetPenaltyState(int slot, absl::Span<const int32_t> prompt,
                                       absl::Span<const int32_t> generated) = 0;

  virtual absl::Status Launch(const StepBatch& batch) = 0;
  // Completes the launched step: fills `out` (StepOutput::Resize'd by the backend).
  virtual absl::Status Wait(StepOutput* out) = 0;

  absl::Status Step(const StepBatch& batch, StepOutput* out) {
    if (absl::Status s = Launch(batch); !s.ok()) return s;
    return Wait(out);
  }

  // True when the backend samples several rows of a sequence in one step (StepBatch
  // sample_rows > 1, speculative decoding's verification); then Prepare accepts
  // StepLimits::max_draft_rows > 0. False: the engine never speculates on it.
  virtual bool VerifiesDrafts() const { return false; }

  // True when Launch takes a step while another is in flight, and chained tokens
  // (step_batch.h) that name the previous launched step's sampled slots, resolved where that
  // step's samples lie (its device), so the host need not wait for them: pipelined steps
  // (docs/DESIGN.md "Pipelined steps"). False: one step at a time and no chained tokens.
  virtual bool ChainsSteps() const { return false; }
  // True when Launch returns before the step's work is done (a device runs it), so host work
  // between a Launch and the previous step's Wait overlaps the device's: where pipelined
  // steps pay (EngineOptions::pipeline_steps kAuto). False where Launch computes the step.
  virtual bool LaunchReturnsEarly() const { return false; }

  // Tokens a step may hold (<= max_tokens) while it stays bound by reading the weights,
  // measured now on this backend's weights and hardware with MemoryBoundTokens
  // (memory_bound.h); speculative decoding drafts only up to it. 0: not measured (the
  // engine then drafts up to its other limits). Costs a few times the step work of each
  // size it tries (it stops at the first size past the budget); call it outside any step.
  virtual int MeasureMemoryBoundTokens(int max_tokens) { return 0; }

  // OK while the backend can run steps; the sticky failure once it cannot.
  virtual absl::Status health() const { return absl::OkStatus(); }
};

// Wraps a backend in another that forwards to it: how a test build breaks a real backend on
// purpose (tests/testing/fault_injecting_backend.h); the server applies one after loading.
using BackendDecorator = std::function<std::unique_ptr<Backend>(std::unique_ptr<Backend>)>;

}  // namespace dcf
