#include "engine/serving/engine.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/common/compute_threads.h"
#include "engine/common/logging.h"
#include "engine/common/status_macros.h"
#include "engine/serving/engine_impl.h"
#include "engine/serving/engine_setup.h"

namespace dcf {

absl::StatusOr<PipelineSteps> ParsePipelineSteps(absl::string_view name) {
  for (PipelineSteps m : {PipelineSteps::kAuto, PipelineSteps::kOn, PipelineSteps::kOff}) {
    if (name == PipelineStepsName(m)) return m;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("pipeline steps '", name, "': expected auto, on or off"));
}

const char* PipelineStepsName(PipelineSteps mode) {
  switch (mode) {
    case PipelineSteps::kAuto:
      return "auto";
    case PipelineSteps::kOn:
      return "on";
    case PipelineSteps::kOff:
      return "off";
  }
  return "?";
}

using engine_internal::EngineImpl;

// --- Engine ---

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(std::unique_ptr<Backend> backend,
                                                       const Tokenizer* tokenizer,
                                                       const EngineOptions& options,
                                                       EngineObserver* observer) {
  if (backend == nullptr) return absl::InvalidArgumentError("backend is null");
  RETURN_IF_ERROR(engine_internal::ValidateEngineOptions(options));
  std::string step_tokens_source;
  const EngineOptions resolved =
      engine_internal::ResolveEngineOptions(options, *backend, &step_tokens_source);
  const StepLimits limits = engine_internal::EngineStepLimits(resolved, backend->config());
  ASSIGN_OR_RETURN(const size_t available, backend->Prepare(limits));
  ASSIGN_OR_RETURN(const KvCacheShape shape,
                   engine_internal::PlanEngineKvCache(options, *backend, limits, available));
  RETURN_IF_ERROR(backend->AllocateCache(shape));
  const BackendInfo info = backend->info();
  auto impl = std::make_shared<EngineImpl>(std::move(backend), tokenizer, resolved, observer,
                                           shape, limits);
  DCF_LOG(Info) << "backend " << info.name << " on " << info.device << ", "
                << WeightsName(info) << " weights; KV cache "
                << (impl->Stats().kv_cache_bytes >> 20) << " MiB of " << (available >> 20)
                << " MiB available: " << shape.num_blocks[0] << " global + "
                << shape.num_blocks[1] << " window blocks of " << shape.block_size
                << " tokens; prefix caching " << (options.prefix_caching ? "on" : "off")
                << "; speculative decoding "
                << (resolved.spec_tokens > 0
                        ? absl::StrCat(resolved.spec_tokens, " tokens, drafts while a step holds "
                                       "at most ",
                                       resolved.spec_step_tokens > 0
                                           ? absl::StrCat(resolved.spec_step_tokens)
                                           : std::string("any number of"),
                                       " tokens (", step_tokens_source, ")")
                        : std::string("off"))
                << "; pipelined steps " << PipelineStepsName(resolved.pipeline_steps);
  // The loop thread runs every step with its own OpenMP team: the workers this thread started
  // (packing the weights, the measurement above) would only wait, or spin with
  // OMP_WAIT_POLICY=active on the cores the steps need.
  ReleaseIdleComputeThreads();
  impl->Start();
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

Engine::Engine(std::shared_ptr<EngineImpl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() { Shutdown(); }

absl::StatusOr<RequestHandle> Engine::Enqueue(GenerationRequest request) {
  std::vector<GenerationRequest> one;
  one.push_back(std::move(request));
  ASSIGN_OR_RETURN(std::vector<RequestHandle> handles, EnqueueAll(std::move(one)));
  return std::move(handles[0]);
}
absl::StatusOr<std::vector<RequestHandle>> Engine::EnqueueAll(
    std::vector<GenerationRequest> requests, int* failed) {
  ASSIGN_OR_RETURN(std::vector<std::shared_ptr<RequestStream>> streams,
                   impl_->EnqueueAll(std::move(requests), failed));
  std::vector<RequestHandle> handles;
  handles.reserve(streams.size());
  for (std::shared_ptr<RequestStream>& s : streams) {
    handles.push_back(RequestHandle(impl_, std::move(s)));
  }
  return handles;
}
absl::Status Engine::CheckQueueable(absl::Span<const GenerationRequest> requests,
                                    int* failed) const {
  return impl_->CheckQueueable(requests, failed);
}
void Engine::Cancel(uint64_t request_key) { impl_->Cancel(request_key); }
void Engine::StopAccepting() { impl_->StopAccepting(); }
void Engine::Shutdown() { impl_->Shutdown(); }
EngineStats Engine::Stats() const { return impl_->Stats(); }
const ModelConfig& Engine::config() const { return impl_->config(); }
const EngineOptions& Engine::options() const { return impl_->options(); }
const RequestLimits& Engine::limits() const { return impl_->limits(); }
void Engine::SetStepHookForTesting(StepHook hook) { impl_->SetStepHook(std::move(hook)); }

// --- RequestHandle ---

RequestHandle& RequestHandle::operator=(RequestHandle&& other) {
  if (this != &other) {
    Cancel();
    engine_ = std::move(other.engine_);
    stream_ = std::move(other.stream_);
  }
  return *this;
}

RequestHandle::~RequestHandle() { Cancel(); }

void RequestHandle::Cancel() { canceller().Cancel(); }

void RequestCanceller::Cancel() const {
  const std::shared_ptr<RequestStream> stream = stream_.lock();
  if (stream == nullptr || stream->done()) return;
  if (std::shared_ptr<EngineImpl> engine = engine_.lock()) engine->Cancel(stream->key());
}

}  // namespace dcf
