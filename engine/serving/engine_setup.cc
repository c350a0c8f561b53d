#include "engine/serving/engine_setup.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "engine/common/logging.h"
#include "engine/common/status_macros.h"
#include "engine/kv/kv_cache_planner.h"

namespace dcf::engine_internal {

absl::Status ValidateEngineOptions(const EngineOptions& options) {
  if (options.block_size <= 0) return absl::InvalidArgumentError("block_size must be > 0");
  if (options.max_num_seqs <= 0) return absl::InvalidArgumentError("max_num_seqs must be > 0");
  if (options.max_num_batched_tokens <= 0) {
    return absl::InvalidArgumentError("max_num_batched_tokens must be > 0");
  }
  // Every request waits in the queue before it runs: a limit of 0 would refuse them all.
  if (options.max_queued_requests < 1 || options.max_queued_prompt_tokens < 1) {
    return absl::InvalidArgumentError("queue limits must be >= 1");
  }
  if (!(options.watermark >= 0 && options.watermark < 1)) {
    return absl::InvalidArgumentError("watermark must be in [0, 1)");
  }
  if (options.default_max_new_tokens < 1) {
    return absl::InvalidArgumentError("default_max_new_tokens must be >= 1");
  }
  // Upper bounds: kMaxSpecTokens, kMaxSpecNgram (engine.h).
  if (options.spec_tokens < 0 || options.spec_tokens > kMaxSpecTokens ||
      options.spec_max_step_drafts < 0 ||
      options.spec_max_step_drafts > options.max_num_batched_tokens ||
      options.spec_step_tokens < 0 || options.spec_step_tokens > options.max_num_batched_tokens ||
      options.spec_ngram_min < 1 || options.spec_ngram_max < options.spec_ngram_min ||
      options.spec_ngram_max > kMaxSpecNgram) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec_tokens must be in [0, ", kMaxSpecTokens,
                     "], spec_max_step_drafts and "
                     "spec_step_tokens in [0, max_num_batched_tokens], and 1 <= spec_ngram_min <= "
                     "spec_ngram_max <= ",
                     kMaxSpecNgram));
  }
  return absl::OkStatus();
}

EngineOptions ResolveEngineOptions(const EngineOptions& options, Backend& backend,
                                   std::string* step_tokens_source) {
  const ModelConfig& c = backend.config();
  // The speculation in effect: the options' draft length, capped where the window rule
  // needs it (a verify chunk's rows must all get window blocks: kv_cache_manager.h), off on a
  // backend that cannot verify.
  EngineOptions resolved = options;
  if (resolved.spec_tokens > 0 && !backend.VerifiesDrafts()) {
    DCF_LOG(Warning) << "speculative decoding is off: backend " << backend.info().name
                     << " cannot verify drafted tokens";
    resolved.spec_tokens = 0;
  }
  if (resolved.spec_tokens > 0 && c.NumLayersIn(LayerGroup::kWindow) > 0 &&
      !options.prefix_caching) {
    resolved.spec_tokens = std::max(0, std::min(resolved.spec_tokens, c.window_size - 2));
  }
  if (resolved.spec_tokens > 0 && resolved.spec_max_step_drafts == 0) {
    resolved.spec_max_step_drafts = 4 * resolved.spec_tokens;
  }
  if (resolved.spec_tokens == 0) resolved.spec_max_step_drafts = 0;
  // The step token budget of the drafts: given, else measured (0 = no cap).
  *step_tokens_source = "given";
  if (resolved.spec_tokens == 0) {
    resolved.spec_step_tokens = 0;
  } else if (resolved.spec_step_tokens == 0) {
    resolved.spec_step_tokens = backend.MeasureMemoryBoundTokens(options.max_num_batched_tokens);
    *step_tokens_source = resolved.spec_step_tokens > 0 ? "measured" : "not measured";
  }
  if (resolved.spec_step_tokens == 1) {
    // A step of one token leaves no room for a draft: no proposer runs at all.
    DCF_LOG(Info) << "speculative decoding is off: "
                  << (*step_tokens_source == std::string("measured")
                          ? "a step of 2 tokens is not memory-bound (measured step token "
                            "budget 1)"
                          : "a step token budget of 1 leaves no room for drafts");
    resolved.spec_tokens = 0;
    resolved.spec_max_step_drafts = 0;
    resolved.spec_step_tokens = 0;
  }
  // Pipelined steps where the backend chains them, and by default where that pays.
  const bool chains = backend.ChainsSteps();
  if (options.pipeline_steps == PipelineSteps::kOn && !chains) {
    DCF_LOG(Warning) << "pipelined steps are off: backend " << backend.info().name
                     << " cannot chain steps";
  }
  resolved.pipeline_steps =
      chains && (options.pipeline_steps == PipelineSteps::kOn ||
                 (options.pipeline_steps == PipelineSteps::kAuto && backend.LaunchReturnsEarly()))
          ? PipelineSteps::kOn
          : PipelineSteps::kOff;
  return resolved;
}

StepLimits EngineStepLimits(const EngineOptions& resolved, const ModelConfig& c) {
  StepLimits limits;
  limits.max_tokens = resolved.max_num_batched_tokens;
  limits.max_draft_rows = resolved.spec_max_step_drafts;
  limits.max_seqs = std::min(resolved.max_num_seqs, resolved.max_num_batched_tokens);
  limits.max_logit_rows = 0;  // the engine never asks for logits
  limits.blocks_per_seq = (c.max_positions + resolved.block_size - 1) / resolved.block_size;
  limits.num_penalty_slots = limits.max_seqs;  // one per running sequence
  return limits;
}

absl::StatusOr<KvCacheShape> PlanEngineKvCache(const EngineOptions& options, const Backend& backend,
                                               const StepLimits& limits, size_t available) {
  const ModelConfig& c = backend.config();
  KvCacheShape shape;
  if (options.kv_num_blocks[0] > 0 || options.kv_num_blocks[1] > 0) {
    if (options.kv_num_blocks[0] <= 0 || options.kv_num_blocks[1] <= 0) {
      return absl::InvalidArgumentError("kv_num_blocks needs both groups > 0");
    }
    shape.block_size = options.block_size;
    shape.window = c.window_size;
    shape.num_blocks = options.kv_num_blocks;
  } else {
    size_t budget = options.kv_cache_bytes;
    if (budget == 0) {
      if (!(options.kv_cache_fraction > 0 && options.kv_cache_fraction <= 1)) {
        return absl::InvalidArgumentError("kv_cache_fraction must be in (0, 1]");
      }
      budget = static_cast<size_t>(options.kv_cache_fraction * static_cast<double>(available));
    }
    KvPlanInput in;
    in.budget_bytes = budget;
    in.block_size = options.block_size;
    in.window = c.window_size;
    in.context = c.max_positions;
    in.max_num_seqs = limits.max_seqs;
    in.max_num_batched_tokens = options.max_num_batched_tokens;
    for (int g = 0; g < kNumLayerGroups; ++g) {
      in.bytes_per_block[g] =
          c.NumLayersIn(static_cast<LayerGroup>(g)) > 0
              ? backend.BytesPerBlock(static_cast<LayerGroup>(g), options.block_size)
              : 0;
    }
    ASSIGN_OR_RETURN(shape, PlanKvCache(in));
    // The budget is an upper bound: say why the cache stays below it (docs/API.md), when it
    // does, by at least a block.
    size_t bytes = 0;
    size_t smallest_block = 0;
    for (int g = 0; g < kNumLayerGroups; ++g) {
      bytes += in.bytes_per_block[g] * static_cast<size_t>(shape.num_blocks[g]);
      const size_t b = in.bytes_per_block[g];
      if (b > 0 && (smallest_block == 0 || b < smallest_block)) smallest_block = b;
    }
    if (KvPlanIsCappedBySequences(in, shape) && bytes + smallest_block <= budget) {
      DCF_LOG(Info) << "KV cache: " << (bytes >> 20) << " MiB of its " << (budget >> 20)
                    << " MiB budget, all that " << in.max_num_seqs
                    << (in.max_num_seqs == 1 ? " sequence" : " sequences")
                    << " (max_num_seqs) of the full " << in.context
                    << "-token context can use; more sequences would use more of it";
    }
  }
  return shape;
}

}  // namespace dcf::engine_internal
