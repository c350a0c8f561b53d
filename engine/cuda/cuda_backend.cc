// CudaBackend (cuda_backend.h), part 1 of 2: the lifecycle (Create, Init, Prepare,
// AllocateCache, SetPenaltyState) and the step machinery (Launch, Plan, Pack, the decode-step
// graphs, IssueStep, Sample, Wait). The forward pass that IssueStep runs (Forward, the layers,
// Logits and the GEMM arguments they build) is part 2, cuda_backend_forward.cc.
#include "engine/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "engine/common/logging.h"
#include "engine/common/status_macros.h"
#include "engine/cuda/cuda_status.h"
#include "engine/cuda/dyn_weights.h"
#include "engine/cuda/gemm_quant.h"
#include "engine/cuda/gemv.h"
#include "engine/cuda/qk_rope.h"
#include "engine/cuda/sampling_rows.h"
#include "engine/execution/step_plan.h"
#include "engine/sampling/sampling_params.h"
#include "engine/sampling/token_sampler.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {
namespace {

static_assert(kSampleMaxTop == kMaxTopLogprobs, "device and host top-logprob capacity differ");
static_assert(kBranches == ModelConfig::kComposeBranches && kRank == ModelConfig::kRank,
              "DCMHA constants differ between the CUDA kernels and the model");

#if defined(DCF_CUDA_SIM)
constexpr BackendKind kBackendKind = BackendKind::kCudaSim;
constexpr char kBackendName[] = "cuda-sim";
#else
constexpr BackendKind kBackendKind = BackendKind::kCuda;
constexpr char kBackendName[] = "cuda";
#endif

constexpr int C = ModelConfig::kComposeBranches;
constexpr int kI = ModelConfig::kRank;
// cuBLASLt workspace (NVIDIA recommends 32 MiB on Hopper).
constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;
// Device memory Prepare keeps back from the KV cache (allocator slack, library handles).
constexpr size_t kReserveBytes = size_t{256} << 20;

ElemType ToElemType(DType d) {
  switch (d) {
    case DType::kF32:
      return ElemType::kF32;
    case DType::kBF16:
      return ElemType::kBF16;
    case DType::kF16:
      return ElemType::kF16;
    case DType::kI8:  // refused before: LoadModel keeps int8 weights on the cpu backend
      break;
  }
  return ElemType::kF32;
}

size_t Align16(size_t n) { return (n + 15) / 16 * 16; }

// Appends arrays at 16-byte aligned offsets into a host staging buffer.
class Packer {
 public:
  explicit Packer(uint8_t* base) : base_(base) {}
  template <typename T>
  size_t Put(const T* data, size_t count) {
    const size_t at = used_;
    if (count > 0) std::memcpy(base_ + at, data, count * sizeof(T));
    used_ = Align16(used_ + count * sizeof(T));
    return at;
  }
  size_t used() const { return used_; }

 private:
  uint8_t* base_;
  size_t used_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    const ModelConfig& config, ModelWeights weights, const BackendOptions& options) {
  // The cache holds the dtype the kernels compute in: no other is supported.
  const DType dtype = options.dtype.value_or(kDefaultCudaDType);
  if (options.kv_cache_dtype.has_value() && *options.kv_cache_dtype != dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv-cache-dtype ", ComputeDTypeName(*options.kv_cache_dtype), ": the ", kBackendName,
        " backend keeps its KV cache in its weights' dtype (--dtype ", ComputeDTypeName(dtype),
        "); only --kv-cache-dtype ", ComputeDTypeName(dtype),
        " is supported (the cpu backend takes float32, bfloat16 or float16)"));
  }
  RETURN_IF_ERROR(CheckQuantization(kBackendKind, options));
  if (config.n_head > kMaxDynHeads || config.head_dim > kMaxQkRopeHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ", kBackendName, " backend supports n_head <= ", kMaxDynHeads, " and head_dim <= ",
        kMaxQkRopeHeadDim, " (model: ", config.n_head, ", ", config.head_dim, ")"));
  }
  if (!DcmhaShapeSupported(config.n_head, config.head_dim)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", kBackendName, " backend's attention kernels do not support ",
                     config.n_head, " heads of ", config.head_dim,
                     " (engine/cuda/dcmha_attention.h: n_head * head_dim <= "
                     "4096 within 96 KiB of shared memory)"));
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count <= options.device || options.device < 0) {
    cudaGetLastError();
    return absl::UnavailableError(absl::StrCat("--backend ", kBackendName, ": CUDA device ",
                                               options.device, " is not visible (", count,
                                               " devices)"));
  }
  if (config.max_positions <= 0 || config.max_positions > ModelConfig::kMaxPositions) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ", kBackendName, " backend serves contexts of 1 to ", ModelConfig::kMaxPositions,
        " positions (model: ", config.max_positions, ")"));
  }
  try {  // a host allocation failure becomes a Status, never an exception out of the backend
    std::unique_ptr<CudaBackend> b(new CudaBackend(config, options));
    RETURN_IF_ERROR(b->Init(std::move(weights)));
    return b;
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of host memory creating the ", kBackendName, " backend"));
  }
}

CudaBackend::CudaBackend(const ModelConfig& config, const BackendOptions& options)
    : config_(config), layout_(config), options_(options) {
  options_.dtype = options.dtype.value_or(kDefaultCudaDType);
  dtype_ = ToElemType(*options_.dtype);
  matrices_ = options.weight_quant == WeightQuant::kInt8  ? WeightType::kI8
              : options.weight_quant == WeightQuant::kFp8 ? WeightType::kFp8
                                                          : WeightType::kDense;
  fp8_activations_ = options.activation_quant == ActivationQuant::kFp8;
  for (int g = 0; g < kNumLayerGroups; ++g) {
    layers_in_group_[g] = config_.NumLayersIn(static_cast<LayerGroup>(g));
  }
}

CudaBackend::~CudaBackend() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  DropGraphs();
  for (cudaEvent_t e : penalty_done_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  for (cudaEvent_t e : done_) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status CudaBackend::Init(ModelWeights weights) {
  DCF_CUDA_RETURN_IF_ERROR(cudaSetDevice(options_.device), "cudaSetDevice");
  cudaDeviceProp prop{};
  DCF_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, options_.device),
                           "cudaGetDeviceProperties");
  device_name_ = prop.name;
  if (fp8_activations_) {
    if (absl::Status s = Fp8GemmSupport(prop.major, prop.minor); !s.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("--activation-dtype fp8 on ", prop.name, ": ", s.message()));
    }
  }
  DCF_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                           "cudaStreamCreate");
  // Wait blocks the engine thread on these events: a blocking sync sleeps instead of
  // spinning a core for the whole step.
  for (cudaEvent_t& e : done_) {
    DCF_CUDA_RETURN_IF_ERROR(
        cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync),
        "cudaEventCreate");
  }
  ASSIGN_OR_RETURN(gemm_, Gemm::Create(kGemmWorkspaceBytes));
  const char* graphs = std::getenv("DCF_CUDA_GRAPHS");
  use_graphs_ = graphs == nullptr || std::string_view(graphs) != "0";
#if defined(DCF_CUDA_SIM)
  const char* sim_gemv = std::getenv("DCF_SIM_GEMV");
  use_gemv_ = sim_gemv != nullptr && std::string_view(sim_gemv) == "1";
#endif
  ASSIGN_OR_RETURN(weights_, UploadWeights(config_, std::move(weights), dtype_,
                                             options_.check_weights, matrices_));

  // RoPE angles of every position (RopeAngles, as the CPU backend computes them per token),
  // so both backends rotate by bit-identical cos/sin. The device tables come first
  // (ResourceExhausted when the device has no room for them), then are filled a bounded run
  // of positions at a time: host memory does not grow with the context.
  const int half = config_.rotary_dim / 2;
  if (half > 0) {
    const int64_t n = static_cast<int64_t>(config_.max_positions) * half;
    ASSIGN_OR_RETURN(rope_cos_, DeviceBuffer::Allocate(n * sizeof(float), "RoPE table"));
    ASSIGN_OR_RETURN(rope_sin_, DeviceBuffer::Allocate(n * sizeof(float), "RoPE table"));
    constexpr int64_t kPositionsPerUpload = 4096;
    const int64_t run = std::min<int64_t>(kPositionsPerUpload, config_.max_positions);
    std::vector<float> cs(run * half), sn(run * half);
    for (int64_t first = 0; first < config_.max_positions; first += run) {
      const int64_t count = std::min<int64_t>(run, config_.max_positions - first);
      for (int64_t p = 0; p < count; ++p) {
        RopeAngles(first + p, config_.rotary_dim, config_.rope_base, &cs[p * half],
                   &sn[p * half]);
      }
      const size_t bytes = count * half * sizeof(float);
      DCF_CUDA_RETURN_IF_ERROR(cudaMemcpy(rope_cos_.as<float>() + first * half, cs.data(),
                                          bytes, cudaMemcpyHostToDevice),
                               "RoPE table upload");
      DCF_CUDA_RETURN_IF_ERROR(cudaMemcpy(rope_sin_.as<float>() + first * half, sn.data(),
                                          bytes, cudaMemcpyHostToDevice),
                               "RoPE table upload");
    }
  }
  // Copies and memsets on the legacy default stream are not ordered with stream_ (created
  // non-blocking): finish them before any step can run.
  DCF_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "weight upload");
  return absl::OkStatus();
}

BackendInfo CudaBackend::info() const {
  BackendInfo info;
  info.name = kBackendName;
  info.device = device_name_;
  info.dtype = *options_.dtype;
  info.kv_cache_dtype = *options_.dtype;
  info.channel_quant = options_.weight_quant;
  info.fp8_activations = fp8_activations_;
  return info;
}

size_t CudaBackend::BytesPerBlock(LayerGroup g, int block_size) const {
  return KvBytesPerBlock(config_, g, block_size, ElemBytes(dtype_));
}

absl::Status CudaBackend::UseDevice() {
  RETURN_IF_ERROR(health_);
  // The current device is per host thread: the engine loop is not the thread that created
  // the backend.
  const cudaError_t e = cudaSetDevice(options_.device);
  if (e != cudaSuccess) return Fail(CudaStatus(e, "cudaSetDevice"));
  return absl::OkStatus();
}

absl::Status CudaBackend::Fail(absl::Status status) {
  if (health_.ok()) {
    health_ =
        absl::InternalError(absl::StrCat(kBackendName, " backend failed: ", status.message()));
  }
  in_flight_.clear();  // their results are lost with the device
  return health_;
}

absl::StatusOr<size_t> CudaBackend::Prepare(const StepLimits& limits) {
  RETURN_IF_ERROR(UseDevice());
  RETURN_IF_ERROR(ValidateStepLimits(limits));
  prepared_ = false;
  in_flight_.clear();  // the buffers they use are released here
  last_chainable_.clear();
  DropGraphs();  // they name the buffers released here
  // Release the previous workspace first, so that it does not count twice.
  for (DeviceBuffer* b :
       {&x_, &a_, &a2_, &proj_, &dyn_, &attn_out_, &up_, &act_, &final_in_, &logits_, &sample_work_,
        &results_, &sampled_, &attn_workspace_, &step_dev_, &seen_, &counts_}) {
    b->Reset();
  }
  for (int b = 0; b < kStaging; ++b) {
    step_host_[b].Reset();
    results_host_[b].Reset();
  }
  penalty_host_.Reset();  // cudaFreeHost waits for the copies still reading it
  for (cudaEvent_t e : penalty_done_) cudaEventDestroy(e);
  penalty_done_.clear();
  penalty_before_step_.clear();

  const int64_t T = limits.max_tokens, S = limits.max_seqs, E = config_.dim,
                F = config_.intermediate_size, V = config_.vocab_size, N = config_.n_head;
  const int64_t P = FusedInputWidth(config_);
  const bool pythia = config_.architecture == Architecture::kDcPythia;
  const int eb = ElemBytes(dtype_);
  rows_cap_ = MaxLogitRows(limits);
  // Every sampled row is a new token: one per sequence, plus the verified drafts.
  sampled_cap_ = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(T, S + int64_t{limits.max_draft_rows})));
  const int64_t R_s = sampled_cap_;
  const int64_t slots = limits.num_penalty_slots;
  const size_t step_bytes = Align16(4 * T) * 3 + Align16(4 * (S + 1)) +
                            2 * Align16(4 * S * limits.blocks_per_seq) + Align16(4 * rows_cap_) +
                            Align16(sizeof(DeviceSamplingRow) * R_s) + 16;

  ASSIGN_OR_RETURN(x_, DeviceBuffer::Allocate(4 * T * E, "the residual stream"));
  ASSIGN_OR_RETURN(a_, DeviceBuffer::Allocate(eb * T * E, "normed activations"));
  if (pythia) {
    ASSIGN_OR_RETURN(a2_, DeviceBuffer::Allocate(eb * T * E, "normed activations"));
  }
  ASSIGN_OR_RETURN(proj_, DeviceBuffer::Allocate(4 * T * P, "the input projection"));
  ASSIGN_OR_RETURN(dyn_, DeviceBuffer::Allocate(4 * T * C * 2 * kI * N, "dynamic weights"));
  ASSIGN_OR_RETURN(attn_out_, DeviceBuffer::Allocate(eb * T * E, "attention output"));
  ASSIGN_OR_RETURN(up_, DeviceBuffer::Allocate(4 * T * F * (pythia ? 1 : 2), "MLP input"));
  ASSIGN_OR_RETURN(act_, DeviceBuffer::Allocate(eb * T * F, "MLP activations"));
  ASSIGN_OR_RETURN(final_in_, DeviceBuffer::Allocate(eb * rows_cap_ * E, "final norm rows"));
  ASSIGN_OR_RETURN(logits_, DeviceBuffer::Allocate(4 * rows_cap_ * V, "logits"));
  ASSIGN_OR_RETURN(sample_work_, DeviceBuffer::Allocate(4 * R_s * V, "sampler workspace"));
  ASSIGN_OR_RETURN(results_,
                   DeviceBuffer::Allocate(sizeof(SampleResult) * R_s, "sampler results"));
  ASSIGN_OR_RETURN(sampled_, DeviceBuffer::Allocate(4 * R_s, "sampled tokens"));
  ASSIGN_OR_RETURN(attn_workspace_,
                   DeviceBuffer::Allocate(DcmhaWorkspaceBytes(config_.n_head, config_.head_dim, T,
                                                              S, config_.max_positions),
                                          "attention workspace"));
  ASSIGN_OR_RETURN(step_dev_, DeviceBuffer::Allocate(step_bytes, "step arrays"));
  ASSIGN_OR_RETURN(seen_, DeviceBuffer::Allocate(slots * V, "penalty state"));
  ASSIGN_OR_RETURN(counts_, DeviceBuffer::Allocate(4 * slots * V, "penalty state"));
  for (int b = 0; b < kStaging; ++b) {
    ASSIGN_OR_RETURN(step_host_[b], PinnedBuffer::Allocate(step_bytes, "step staging"));
    ASSIGN_OR_RETURN(results_host_[b],
                     PinnedBuffer::Allocate(sizeof(SampleResult) * R_s, "sampler results"));
  }
  penalty_stride_ = Align16(V) + Align16(4 * V);
  if (slots > 0) {
    ASSIGN_OR_RETURN(penalty_host_,
                     PinnedBuffer::Allocate(slots * penalty_stride_, "penalty staging"));
    penalty_before_step_.assign(slots, 0);
    penalty_done_.reserve(slots);
    for (int64_t i = 0; i < slots; ++i) {
      cudaEvent_t e = nullptr;
      DCF_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming),
                               "cudaEventCreate");
      penalty_done_.push_back(e);
    }
  }
  DCF_CUDA_RETURN_IF_ERROR(
      DcmhaInitWorkspace(attn_workspace_.get(), attn_workspace_.bytes(), stream_),
      "attention workspace reset");
  DCF_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "attention workspace reset");
  if (slots > 0) {
    DCF_CUDA_RETURN_IF_ERROR(cudaMemset(seen_.get(), 0, seen_.bytes()), "penalty state reset");
    DCF_CUDA_RETURN_IF_ERROR(cudaMemset(counts_.get(), 0, counts_.bytes()), "penalty state reset");
    // The legacy stream's memsets are not ordered with stream_ (non-blocking), where
    // SetPenaltyState and the sampler touch this state: finish them now.
    DCF_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "penalty state reset");
  }
  limits_ = limits;
  // Plans (candidates timed on a GPU) for every product the steps will run: no step builds
  // one. Products the GEMV takes never reach the library.
  const std::vector<GemmArgs> products = LibraryProducts();
  // Quantized weights whose rows the GEMV cannot load (gemv.h) run every m on the library.
  bool gemv_takes_all = use_gemv_;
  for (GemmArgs p : products) {
    p.m = 1;
    gemv_takes_all = gemv_takes_all && GemvHandles(p);
  }
  const int library_min_m = gemv_takes_all ? kGemvMaxRows + 1 : 1;
  if (absl::Status st = gemm_->Prepare(products, library_min_m, stream_); !st.ok()) {
    return Fail(st);
  }
  if (const char* log = std::getenv("DCF_GEMM_PLAN_LOG"); log != nullptr && log[0] == '1') {
    for (const GemmPlanChoice& c : gemm_->choices()) DCF_LOG(Info) << DescribeGemmChoice(c);
  }
  prepared_ = true;
  size_t free_bytes = 0, total_bytes = 0;
  DCF_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  // Whatever the caches already hold counts as available: AllocateCache replaces them.
  for (const DeviceBuffer& c : cache_) free_bytes += c.bytes();
  return free_bytes > kReserveBytes ? free_bytes - kReserveBytes : 0;
}

absl::Status CudaBackend::AllocateCache(const KvCacheShape& shape) {
  RETURN_IF_ERROR(UseDevice());
  if (!prepared_) return absl::FailedPreconditionError("AllocateCache before Prepare");
  RETURN_IF_ERROR(ValidateCacheShape(shape, config_));
  cache_shape_ = KvCacheShape();  // unusable until the allocation succeeded
  DropGraphs();                   // they name the caches released here
  for (DeviceBuffer& c : cache_) c.Reset();
  for (int g = 0; g < kNumLayerGroups; ++g) {
    const size_t bytes = BytesPerBlock(static_cast<LayerGroup>(g), shape.block_size) *
                         static_cast<size_t>(shape.num_blocks[g]);
    absl::StatusOr<DeviceBuffer> buf = DeviceBuffer::Allocate(bytes, "the KV cache");
    if (!buf.ok()) {
      for (DeviceBuffer& c : cache_) c.Reset();
      return buf.status();
    }
    cache_[g] = std::move(*buf);
    // Zero, so that no kernel can ever read uninitialised (possibly NaN) cache memory.
    if (bytes > 0) {
      DCF_CUDA_RETURN_IF_ERROR(cudaMemset(cache_[g].get(), 0, bytes), "KV cache reset");
    }
  }
  // The zeroing ran on the legacy stream, which stream_ (non-blocking) does not wait for: a
  // first step could otherwise write K/V rows that the memset then clears.
  DCF_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "KV cache reset");
  cache_shape_ = shape;
  return absl::OkStatus();
}

absl::Status CudaBackend::SetPenaltyState(int slot, absl::Span<const int32_t> prompt,
                                          absl::Span<const int32_t> generated) {
  RETURN_IF_ERROR(UseDevice());
  if (slot < 0 || slot >= limits_.num_penalty_slots || !prepared_) {
    return absl::InvalidArgumentError(absl::StrCat("penalty slot ", slot, " is not one of the ",
                                                   prepared_ ? limits_.num_penalty_slots : 0,
                                                   " prepared"));
  }
  const int V = config_.vocab_size;
  // The host sampler's state for these tokens (one rule: PenaltyState::Reset), uploaded.
  PenaltyState state(V);
  state.Reset(prompt, generated);
  // Through the slot's own staging area, once its previous copies are done: in the engine
  // they preceded a step already waited for (no device call); else wait for them alone, never
  // for the stream. The copies are stream-ordered after any step still in flight and before
  // the next one.
  const int i = slot;
  cudaError_t e = cudaSuccess;
  if (penalty_before_step_[i] > steps_waited_) {
    e = cudaEventSynchronize(penalty_done_[i]);
    if (e != cudaSuccess) return Fail(CudaStatus(e, "SetPenaltyState"));
  }
  uint8_t* host_seen = penalty_host_.as<uint8_t>() + i * penalty_stride_;  // [V] u8
  int32_t* host_counts = reinterpret_cast<int32_t*>(host_seen + Align16(V));  // [V] i32
  std::memcpy(host_seen, state.seen_flags().data(), V);
  std::memcpy(host_counts, state.counts().data(), sizeof(int32_t) * V);
  e = cudaMemcpyAsync(seen_.as<uint8_t>() + static_cast<int64_t>(slot) * V, host_seen, V,
                      cudaMemcpyHostToDevice, stream_);
  if (e == cudaSuccess) {
    e = cudaMemcpyAsync(counts_.as<int32_t>() + static_cast<int64_t>(slot) * V, host_counts,
                        sizeof(int32_t) * V, cudaMemcpyHostToDevice, stream_);
  }
  if (e == cudaSuccess) e = cudaEventRecord(penalty_done_[i], stream_);
  if (e != cudaSuccess) return Fail(CudaStatus(e, "SetPenaltyState"));
  penalty_before_step_[i] = steps_launched_ + 1;
  return absl::OkStatus();
}

absl::Status CudaBackend::Launch(const StepBatch& batch) {
  RETURN_IF_ERROR(UseDevice());
  if (!prepared_) return absl::FailedPreconditionError("Launch before Prepare");
  if (static_cast<int>(in_flight_.size()) == kStaging) {
    return absl::FailedPreconditionError("Launch while 2 steps are in flight");
  }
  if (!in_flight_.empty() && in_flight_.back().plan.logits.num_returned > 0) {
    // Wait copies them from logits_, which this step would overwrite.
    return absl::FailedPreconditionError("Launch before the Wait of a step that returns logits");
  }
  RETURN_IF_ERROR(ValidateStepBatch(batch, config_, cache_shape_, limits_));
  RETURN_IF_ERROR(CheckChainedTokens(batch, last_chainable_));
  DCF_TRACE_STEP(batch.num_tokens(), batch.num_seqs());
  ASSIGN_OR_RETURN(DevicePlan plan, Plan(batch));
  // The staging buffers the step in flight does not use: its copies may still be queued.
  // Buffer 0 whenever the step is alone (serial steps always use it).
  const int buffer = in_flight_.empty() ? 0 : 1 - in_flight_.back().buffer;
  if (const int key = GraphKeyOf(plan, buffer); key >= 0) {
    // Grids for the longest context, as the graph is captured for any (GraphKeyOf).
    plan.max_position = config_.max_positions - 1;
    RETURN_IF_ERROR(LaunchGraphed(batch, plan, buffer, key));
  } else {
    size_t bytes = 0;
    ASSIGN_OR_RETURN(const StepArrays d, Pack(batch, plan, buffer, &bytes));
    if (absl::Status st = IssueStep(d, bytes, plan, buffer); !st.ok()) return Fail(st);
  }
  if (cudaError_t e = cudaEventRecord(done_[buffer], stream_); e != cudaSuccess) {
    return Fail(CudaStatus(e, "cudaEventRecord"));
  }
  last_chainable_ = ChainableSlots(batch);
  in_flight_.push_back(InFlight{std::move(plan), buffer, ++steps_launched_});
  return absl::OkStatus();
}

absl::StatusOr<CudaBackend::DevicePlan> CudaBackend::Plan(const StepBatch& batch) const {
  DevicePlan plan;
  plan.num_tokens = batch.num_tokens();
  plan.num_seqs = batch.num_seqs();
  for (int s = 0; s < plan.num_seqs; ++s) {
    plan.max_seq_tokens = std::max(plan.max_seq_tokens, batch.seq_len(s));
    plan.max_position = std::max(plan.max_position, batch.start_pos(s) + batch.seq_len(s) - 1);
  }
  plan.logits = PlanLogitRows(batch);
  if (static_cast<int>(plan.logits.rows.size()) > rows_cap_) {
    return absl::InternalError(absl::StrCat("step needs ", plan.logits.rows.size(),
                                            " logits rows, more than the prepared ", rows_cap_));
  }
  const std::vector<int32_t> slots = batch.slot_offsets();
  plan.num_slots = slots.back();
  for (int s : plan.logits.sampled_seqs) {
    const SamplingRow& r = batch.sampling[s];
    const int n = batch.sample_rows[s];  // k + 1 where it verifies k drafts
    SampledSeq seq;
    seq.sampling = r;
    seq.first_row = static_cast<int>(plan.device_rows.size());
    seq.first_slot = slots[s];
    const int first_draft = batch.seq_offsets[s + 1] - (n - 1);  // draft d: row d + 1's token
    seq.drafts.assign(batch.tokens.begin() + first_draft,
                      batch.tokens.begin() + batch.seq_offsets[s + 1]);
    DeviceSamplingRow d;
    d.logit_row = plan.logits.sample_row[s];
    d.penalty_slot = r.penalty_slot;
    SetSamplingParams(r.params, &d);
    d.top_logprobs = r.top_logprobs;
    d.want_logprob = r.logprob ? 1 : 0;
    d.seed = r.seed;
    d.seq_rows = n;
    d.drafts = first_draft;
    for (int j = 0; j < n; ++j) {  // row j: draw step + j, drafts [0, j) in its penalties
      d.step = r.step + j;
      d.draft_index = j;
      plan.device_rows.push_back(d);
      ++d.logit_row;
    }
    plan.record_penalties |= r.penalty_slot >= 0;
    plan.sampled.push_back(std::move(seq));
  }
  if (static_cast<int>(plan.device_rows.size()) > sampled_cap_) {
    return absl::InternalError(absl::StrCat("step samples ", plan.device_rows.size(),
                                            " rows, more than the prepared ", sampled_cap_));
  }
  return plan;
}

void CudaBackend::set_graphs(bool on) {
  use_graphs_ = on;
  if (!on) DropGraphs();
}

void CudaBackend::DropGraphs() {
  for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g.exec);
  graphs_.clear();
}

int CudaBackend::GraphKeyOf(const DevicePlan& plan, int buffer) const {
  if (!use_graphs_ || plan.max_seq_tokens != 1 || plan.logits.num_returned != 0 ||
      static_cast<int>(plan.device_rows.size()) != plan.num_seqs ||
      static_cast<int>(plan.logits.rows.size()) != plan.num_seqs) {
    return -1;
  }
  // The graph's copies name the staging buffers: pipelined steps of one shape use two graphs.
  const int key = kStaging * (2 * plan.num_seqs + (plan.record_penalties ? 1 : 0)) + buffer;
  if (graphs_.count(key) == 0 && static_cast<int>(graphs_.size()) >= kMaxGraphs) return -1;
  return key;
}

absl::Status CudaBackend::LaunchGraphed(const StepBatch& batch, const DevicePlan& plan, int buffer,
                                        int key) {
  size_t bytes = 0;
  ASSIGN_OR_RETURN(const StepArrays d, Pack(batch, plan, buffer, &bytes));
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    // Capture the step once: the graph's copies go through the staging buffers `buffer`, its
    // kernels read the step arrays at the offsets Pack gives every step of this key.
    cudaError_t e = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) return Fail(CudaStatus(e, "cudaStreamBeginCapture"));
    const absl::Status issued = IssueStep(d, bytes, plan, buffer);
    cudaGraph_t graph = nullptr;
    e = cudaStreamEndCapture(stream_, &graph);  // ends the capture even after a failure
    if (!issued.ok()) {
      if (graph != nullptr) cudaGraphDestroy(graph);
      return Fail(issued);
    }
    if (e != cudaSuccess) return Fail(CudaStatus(e, "cudaStreamEndCapture"));
    StepGraph g;
    g.bytes = bytes;
    e = cudaGraphInstantiate(&g.exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) return Fail(CudaStatus(e, "cudaGraphInstantiate"));
    it = graphs_.emplace(key, g).first;
  }
  if (it->second.bytes != bytes) {  // Pack's layout is a function of the key
    return Fail(absl::InternalError("decode step arrays differ from their graph's layout"));
  }
  if (cudaError_t e = cudaGraphLaunch(it->second.exec, stream_); e != cudaSuccess) {
    return Fail(CudaStatus(e, "cudaGraphLaunch"));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::IssueStep(const StepArrays& d, size_t bytes, const DevicePlan& plan,
                                    int buffer) {
  // One step_dev_ serves every step: this copy is stream-ordered after the kernels of the
  // step before, which read it.
  RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(step_dev_.get(), step_host_[buffer].get(), bytes,
                                             cudaMemcpyHostToDevice, stream_),
                             "step upload"));
  RETURN_IF_ERROR(Forward(d, plan));
  return Sample(d, plan, buffer);
}

absl::StatusOr<CudaBackend::StepArrays> CudaBackend::Pack(const StepBatch& batch,
                                                          const DevicePlan& plan, int buffer,
                                                          size_t* bytes) {
  // Every array into the staging buffer, for one copy to the device.
  PinnedBuffer& staging = step_host_[buffer];
  Packer pk(staging.as<uint8_t>());
  const size_t o_tokens = pk.Put(batch.tokens.data(), batch.tokens.size());
  // A chained token names a slot of the previous step; the embedding reads that step's
  // sampled row (CheckChainedTokens made sure there is one).
  int32_t* staged_tokens = reinterpret_cast<int32_t*>(staging.as<uint8_t>() + o_tokens);  // [T]
  for (int t = 0; t < plan.num_tokens; ++t) {
    if (const int slot = ChainedSlot(staged_tokens[t]); slot >= 0) {
      staged_tokens[t] = ChainedToken(last_chainable_[slot]);
    }
  }
  const size_t o_pos = pk.Put(batch.positions.data(), batch.positions.size());
  const size_t o_offsets = pk.Put(batch.seq_offsets.data(), batch.seq_offsets.size());
  std::vector<int32_t> token_seq(plan.num_tokens);
  for (int s = 0; s < plan.num_seqs; ++s) {
    for (int t = batch.seq_offsets[s]; t < batch.seq_offsets[s + 1]; ++t) token_seq[t] = s;
  }
  const size_t o_seq = pk.Put(token_seq.data(), token_seq.size());
  std::array<size_t, kNumLayerGroups> o_tables;
  for (int g = 0; g < kNumLayerGroups; ++g) {
    o_tables[g] = pk.Put(batch.block_tables[g].data(), batch.block_tables[g].size());
  }
  const size_t o_rows = pk.Put(plan.logits.rows.data(), plan.logits.rows.size());
  const size_t o_sampling = pk.Put(plan.device_rows.data(), plan.device_rows.size());
  if (pk.used() > staging.bytes()) {
    return absl::InternalError("step arrays exceed the prepared staging buffer");
  }
  uint8_t* dev = step_dev_.as<uint8_t>();
  StepArrays d;
  d.tokens = reinterpret_cast<const int32_t*>(dev + o_tokens);
  d.positions = reinterpret_cast<const int32_t*>(dev + o_pos);
  d.seq_offsets = reinterpret_cast<const int32_t*>(dev + o_offsets);
  d.token_seq = reinterpret_cast<const int32_t*>(dev + o_seq);
  for (int g = 0; g < kNumLayerGroups; ++g) {
    d.tables[g] = reinterpret_cast<const int32_t*>(dev + o_tables[g]);
  }
  d.logit_rows = reinterpret_cast<const int32_t*>(dev + o_rows);
  d.sampling = reinterpret_cast<const DeviceSamplingRow*>(dev + o_sampling);
  *bytes = pk.used();
  return d;
}

absl::Status CudaBackend::Sample(const StepArrays& d, const DevicePlan& plan, int buffer) {
  const int num_sampled = static_cast<int>(plan.device_rows.size());
  if (num_sampled == 0) return absl::OkStatus();
  SampleParams sp;
  sp.num_rows = num_sampled;
  sp.vocab = config_.vocab_size;
  sp.logits = logits_.as<float>();
  sp.rows = d.sampling;
  sp.tokens = d.tokens;
  sp.seen = seen_.as<uint8_t>();
  sp.counts = counts_.as<int32_t>();
  sp.work = sample_work_.as<float>();
  sp.results = results_.as<SampleResult>();
  sp.sampled = sampled_.as<int32_t>();
  RETURN_IF_ERROR(CudaStatus(LaunchSample(sp, stream_), "sampling"));
  if (plan.record_penalties) {
    RecordSampledParams rp;
    rp.num_rows = num_sampled;
    rp.vocab = config_.vocab_size;
    rp.rows = d.sampling;
    rp.tokens = d.tokens;
    rp.results = results_.as<SampleResult>();
    rp.seen = seen_.as<uint8_t>();
    rp.counts = counts_.as<int32_t>();
    RETURN_IF_ERROR(CudaStatus(LaunchRecordSampled(rp, stream_), "penalty update"));
  }
  return CudaStatus(
      cudaMemcpyAsync(results_host_[buffer].get(), results_.get(),
                      sizeof(SampleResult) * num_sampled, cudaMemcpyDeviceToHost, stream_),
      "result download");
}

absl::Status CudaBackend::Wait(StepOutput* out) {
  RETURN_IF_ERROR(UseDevice());
  if (in_flight_.empty()) return absl::FailedPreconditionError("Wait without a successful Launch");
  InFlight step = std::move(in_flight_.front());
  in_flight_.pop_front();
  if (cudaError_t e = cudaEventSynchronize(done_[step.buffer]); e != cudaSuccess) {
    return Fail(CudaStatus(e, "step"));
  }
  steps_waited_ = step.number;  // and, in stream order, everything queued before it
  const DevicePlan& plan = step.plan;
  const int V = config_.vocab_size;
  const int returned = plan.logits.num_returned;
  out->Resize(plan.num_slots, returned, V);
  if (returned > 0) {  // the first rows of the logits buffer (PlanLogitRows)
    const cudaError_t e = cudaMemcpy(out->logits.data(), logits_.get(),
                                     sizeof(float) * returned * V, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) return Fail(CudaStatus(e, "logits download"));
  }
  const SampleResult* res = results_host_[step.buffer].as<SampleResult>();
  for (const SampledSeq& seq : plan.sampled) {
    // A verifying sequence's rows in order, up to the first that differs from its draft (the
    // rule of AcceptedDrafts) or drew nothing: later rows were sampled as if the drafts
    // before them had been accepted and stay -1 (step_batch.h), as on the CPU.
    const int n = static_cast<int>(seq.drafts.size()) + 1;
    for (int j = 0; j < n; ++j) {
      const SampleResult& r = res[seq.first_row + j];
      StoreSample(seq.sampling, seq.first_slot + j, r.token, r.logprob, r.top_tokens,
                  r.top_logprobs, kSampleMaxTop, out);
      if (r.token < 0) break;
      if (j + 1 < n && r.token != seq.drafts[j]) break;
    }
  }
  return absl::OkStatus();
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
