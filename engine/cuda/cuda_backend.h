// The CUDA backend: the DCFormer forward pass and the token sampler on an NVIDIA GPU, or,
// built against the SIMT emulator (docs/CUDA_SIM.md), the very same kernels on the host
// (backend name "cuda-sim"). The CPU backend (engine/cpu) is its oracle: same math, same
// window rule, same sampler semantics.
//
// Numerics: weights and GEMM inputs in the compute dtype (float32, bfloat16 or float16), or
// the weight matrices int8 / fp8 E4M3 with per-output-channel scales (--weight-dtype;
// docs/QUANTIZATION.md "GPU": the GEMV widens the codes exactly and scales its f32 sums,
// larger products run gemm_quant.h's library path);
// norms, biases, qk-norm scales and qkw in f32; the residual stream, the projection outputs,
// the DCMHA terms and the logits in f32; fp32 accumulation everywhere. With float32 it
// reproduces the CPU backend to rounding.
//
// One step (Launch): the batch is packed into one page-locked buffer and copied with one
// async copy; every layer runs on one stream (embedding, norm, fused q|k|v|dw1|dd GEMM,
// qk-norm + RoPE, dynamic-weight tail, KV-cache write, DCMHA, Wo GEMM accumulating into the
// residual, norm, MLP GEMMs and activation); the final norm and output projection run only
// for rows whose logits are needed (sampled rows and return_logits sequences); the device
// sampler draws the tokens (every row of a verify chunk, speculative decoding); only the
// sampled ids and logprobs come back asynchronously.
// Wait synchronises on an event and copies return_logits rows, if any.
//
// Pipelined steps (ChainsSteps, docs/CUDA_BACKEND.md "Pipelined steps"): a second Launch may
// come before the first step's Wait. The sampler also writes each row's token to a fixed
// device array (sampled_), from which the next step's embedding gathers its chained tokens;
// the step arrays and the results are staged through two page-locked buffers each, one per
// step in flight, so packing step n + 1 never overwrites what step n's copies still read and
// Wait(n) reads step n's results while step n + 1 runs; each step records its own event.
//
// Failures: any CUDA or cuBLAS error during a step is fatal and sticky: health() returns it
// and every later Launch/Wait fails fast with it (after a device fault the context is lost).
//
// Thread-compatibility: one owner thread (see backend.h).
#pragma once

#include <array>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/simt/cuda_compat.h"
#include "engine/cuda/dcmha_attention.h"
#include "engine/cuda/device_buffer.h"
#include "engine/cuda/device_weights.h"
#include "engine/cuda/gemm.h"
#include "engine/cuda/gemv.h"
#include "engine/cuda/norm.h"
#include "engine/cuda/sampling.h"
#include "engine/kv/kv_layout.h"
#include "engine/execution/backend.h"
#include "engine/execution/backend_options.h"
#include "engine/execution/step_plan.h"
#include "engine/model/model_weights.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {

// The compute dtype when BackendOptions::dtype leaves it unset.
inline constexpr DType kDefaultCudaDType = DType::kBF16;

class CudaBackend final : public Backend {
 public:
  // Uploads `weights` (any stored dtype) to device `options.device` in `options.dtype`
  // (kDefaultCudaDType when unset), the matrices quantized as options.weight_quant says;
  // options.kind is not read. InvalidArgument when the model exceeds what the kernels
  // support (n_head or head_dim > 256) or for activation dtypes this backend has no kernels
  // for (int8; fp8 without fp8 weights); FailedPrecondition for fp8 activations on a GPU
  // below compute capability 8.9 (Fp8GemmSupport); Unavailable without a usable device;
  // ResourceExhausted when the weights do not fit.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const ModelConfig& config,
                                                             ModelWeights weights,
                                                             const BackendOptions& options);
  ~CudaBackend() override;

  const ModelConfig& config() const override { return config_; }
  BackendInfo info() const override;
  size_t BytesPerBlock(LayerGroup g, int block_size) const override;
  absl::StatusOr<size_t> Prepare(const StepLimits& limits) override;
  absl::Status AllocateCache(const KvCacheShape& shape) override;
  absl::Status SetPenaltyState(int slot, absl::Span<const int32_t> prompt,
                               absl::Span<const int32_t> generated) override;
  absl::Status Launch(const StepBatch& batch) override;
  absl::Status Wait(StepOutput* out) override;
  absl::Status health() const override { return health_; }
  // Verify chunks (StepBatch::sample_rows > 1): every row sampled at once by the device
  // sampler, each with its own draw and the drafts before it in its penalties (sampling.h).
  bool VerifiesDrafts() const override { return true; }
  // Pipelined steps (above): chained tokens are resolved on the device, and Launch returns
  // once the step is queued.
  bool ChainsSteps() const override { return true; }
  bool LaunchReturnsEarly() const override { return true; }

  // Device bytes of the weights.
  size_t weight_bytes() const { return weights_.bytes; }
  // Decode steps as CUDA graphs (on by default; DCF_CUDA_GRAPHS=0 turns them off at Init).
  // Off: every step is issued call by call. Tests compare both; turning them off drops the
  // graphs captured so far.
  void set_graphs(bool on);
  bool graphs() const { return use_graphs_; }
  // Graphs captured since the last Prepare or AllocateCache.
  int num_graphs() const { return static_cast<int>(graphs_.size()); }
  // The GEMM library's plans: Prepare makes those of every product a step within the limits
  // runs (LibraryProducts), so a step builds none (plans_built_on_use stays as Prepare left
  // it); `gemm_choices` says which candidate each bucket kept.
  Gemm::Stats gemm_stats() const { return gemm_->stats(); }
  const std::vector<GemmPlanChoice>& gemm_choices() const { return gemm_->choices(); }

 private:
  CudaBackend(const ModelConfig& config, const BackendOptions& options);

  // Device addresses of one step's uploaded arrays.
  struct StepArrays {
    const int32_t* tokens = nullptr;                                       // [T]
    const int32_t* positions = nullptr;                                    // [T]
    const int32_t* seq_offsets = nullptr;                                  // [S + 1]
    const int32_t* token_seq = nullptr;                                    // [T]
    std::array<const int32_t*, kNumLayerGroups> tables{nullptr, nullptr};  // [S, bps]
    const int32_t* logit_rows = nullptr;          // [R] step token of each logits row
    const DeviceSamplingRow* sampling = nullptr;  // [num_sampled]
  };
  // The step as the device runs it: the shared plan of its logits rows (step_plan.h) plus
  // what the launch configuration, the sampler and Wait need.
  // One sampled sequence of the step, as Wait scatters its rows.
  struct SampledSeq {
    SamplingRow sampling;         // what it asked for
    int first_row = 0;            // its first row of device_rows / the results
    int first_slot = 0;           // its first output slot (StepBatch::slot_offsets)
    std::vector<int32_t> drafts;  // [sample_rows - 1] the drafts it verifies
  };
  struct DevicePlan {
    int num_tokens = 0, num_seqs = 0;
    int num_slots = 0;  // StepOutput slots: StepBatch::slot_offsets().back()
    int max_seq_tokens = 0, max_position = 0;
    LogitRows logits;                             // rows [R]: returned ones first
    // [num_sampled rows]: per sampled sequence (logits.sampled_seqs order) its sample_rows
    // rows in order
    std::vector<DeviceSamplingRow> device_rows;
    std::vector<SampledSeq> sampled;              // [logits.sampled_seqs.size()]
    bool record_penalties = false;
  };

  absl::Status Init(ModelWeights weights);
  // health_, then makes this backend's device current on the calling thread.
  absl::Status UseDevice();
  // Records `status` as the sticky failure (health()) and returns it.
  absl::Status Fail(absl::Status status);

  // One step, as Launch runs it: plan on the host, pack and upload the step arrays, the
  // layers, the device sampler (Wait then scatters the results, StoreSample); decode steps
  // as one graph launch.
  absl::StatusOr<DevicePlan> Plan(const StepBatch& batch) const;
  // Packs the step arrays into step_host_[buffer] (*bytes: how many), chained tokens as the
  // previous step's sampled rows (the embedding's encoding, embedding.h), and says where they
  // will lie in step_dev_ once IssueStep has copied them.
  absl::StatusOr<StepArrays> Pack(const StepBatch& batch, const DevicePlan& plan, int buffer,
                                  size_t* bytes);
  // Which graph runs a step: decode steps (one new token per sequence) that sample every
  // sequence and return no logits, by sequence count, whether penalties are recorded and
  // the staging buffers it copies through. Everything else of such a step lies at fixed
  // device addresses (Pack's offsets depend on these alone) or in the step arrays, and
  // DCMHA's grids are sized for the model's context (its decode kernels exit early for splits
  // past a token's keys). -1: no graph.
  int GraphKeyOf(const DevicePlan& plan, int buffer) const;
  // Runs a step through the graph of `key`, capturing it first if there is none yet.
  absl::Status LaunchGraphed(const StepBatch& batch, const DevicePlan& plan, int buffer, int key);
  // Upload, layers, sampler, result download through the staging buffers `buffer`: the
  // step's device work on stream_ (also what a graph captures).
  absl::Status IssueStep(const StepArrays& d, size_t bytes, const DevicePlan& plan, int buffer);
  void DropGraphs();
  absl::Status Forward(const StepArrays& d, const DevicePlan& plan);
  absl::Status AttentionLayer(int layer, const StepArrays& d, const StepView& sv);
  absl::Status FeedForward(int layer, int num_tokens);
  // Final norm and output projection of the plan's logits rows into logits_.
  absl::Status Logits(const StepArrays& d, const DevicePlan& plan);
  absl::Status Sample(const StepArrays& d, const DevicePlan& plan, int buffer);

  // y[rows, n] (+)= in[rows, k] . w^T (+ bias), in the compute dtype with f32 accumulation.
  absl::Status Linear(int rows, const void* in, int64_t k, const DeviceMatrix& w,
                      const DeviceBuffer& bias, float* y, int64_t n, bool accumulate);
  GemmArgs LinearArgs(int rows, const void* in, int64_t k, const DeviceMatrix& w,
                      const DeviceBuffer& bias, float* y, int64_t n, bool accumulate) const;
  // y[rows, n] = Norm(x_[rows]) . w^T (+ bias) for LaunchGemv with NormPrologue(norm
  // weight): the f32 residual stream as the product's input.
  GemmArgs NormedLinearArgs(int rows, const DeviceMatrix& w, const DeviceBuffer& bias, float* y,
                            int64_t n) const;
  // The GEMV prologue of the model's norm (RMSNorm, or dcpythia's LayerNorm with bias
  // `norm_b`, which may be empty).
  GemvIn NormPrologue(const DeviceBuffer& norm_w, const DeviceBuffer& norm_b) const;
  // dcpythia, <= kGemvMaxRows rows: the MLP's w1 product as one GEMV, LayerNorm(x_) in its
  // prologue and act_ = GELU(. + b) in its epilogue (PythiaUpOut).
  GemmArgs PythiaUpArgs(int rows, const DeviceLayerWeights& L) const;
  GemvOut PythiaUpOut() const;
  // Every product Forward may hand the GEMM library, each with m = the most rows it has in a
  // step within limits_ (for Gemm::Prepare), on the buffers of Prepare.
  std::vector<GemmArgs> LibraryProducts() const;
  // The norm of `rows` rows of the residual stream x_ with weight `w` and bias `b` (may be
  // empty) into `out` (compute dtype).
  NormParams Norm(int rows, const DeviceBuffer& w, const DeviceBuffer& b, void* out) const;
  CacheView CacheFor(LayerGroup g, const int32_t* table) const;

  ModelConfig config_;
  KvRowLayout layout_;
  BackendOptions options_;  // dtype always set
  ElemType dtype_ = ElemType::kBF16;
  WeightType matrices_ = WeightType::kDense;  // options_.weight_quant
  bool fp8_activations_ = false;              // options_.activation_quant == kFp8
  std::string device_name_;
  std::array<int, kNumLayerGroups> layers_in_group_{0, 0};
  absl::Status health_;

  // Steps in flight at most (pipelined steps), and so staging buffers and events per kind.
  static constexpr int kStaging = 2;
  cudaStream_t stream_ = nullptr;
  std::array<cudaEvent_t, kStaging> done_{};  // recorded behind the step of each buffer
  std::unique_ptr<Gemm> gemm_;
  // Products of <= kGemvMaxRows rows go to LaunchGemv (gemv.h): always on a GPU; on cuda-sim
  // only with DCF_SIM_GEMV=1 (its grid, sized for 132 SMs, costs the emulator a fiber per
  // thread, ~100x OpenBLAS's time; gemv_test checks it against the library GEMM instead).
  bool use_gemv_ = true;
  DeviceWeights weights_;
  DeviceBuffer rope_cos_, rope_sin_;  // [max_positions, r/2] f32

  // Per-step workspace (Prepare), for T = limits.max_tokens tokens:
  StepLimits limits_;
  bool prepared_ = false;
  int rows_cap_ = 0;             // R_max: logits rows of one step
  DeviceBuffer x_;               // [T, E] f32 residual stream
  DeviceBuffer a_, a2_;          // [T, E] dtype normed inputs (a2_: dcpythia MLP input)
  DeviceBuffer proj_;            // [T, FusedInputWidth] f32: q | k | v | a.dw1 | a.dd (-> G)
  DeviceBuffer dyn_;             // [T, C, 2I, N] f32
  DeviceBuffer attn_out_;        // [T, E] dtype
  DeviceBuffer up_;              // [T, 2F] (dcformer) or [T, F] f32
  DeviceBuffer act_;             // [T, F] dtype
  DeviceBuffer final_in_;        // [R_max, E] dtype
  DeviceBuffer logits_;          // [R_max, V] f32
  int sampled_cap_ = 0;          // R_s: sampled rows of one step, min(T, S + max_draft_rows)
  DeviceBuffer sample_work_;     // [R_s, V] f32
  DeviceBuffer results_;         // [R_s] SampleResult
  DeviceBuffer sampled_;         // [R_s] i32 each row's token again: chained tokens' source
  DeviceBuffer attn_workspace_;  // DcmhaWorkspaceBytes
  DeviceBuffer step_dev_;        // the uploaded step arrays
  DeviceBuffer seen_;            // [slots, V] u8
  DeviceBuffer counts_;          // [slots, V] i32
  // Per staging buffer (one per step in flight): the step arrays, and [R_s] SampleResult.
  std::array<PinnedBuffer, kStaging> step_host_;
  std::array<PinnedBuffer, kStaging> results_host_;
  // SetPenaltyState's uploads: one page-locked staging area per penalty slot ([V] u8 seen,
  // then [V] i32 counts, 16-byte aligned), reused only once its last copies are done: known
  // without a device call when a step launched after them was waited for (stream order),
  // else through the event recorded behind them. The engine sets a slot again only after the
  // step that read its previous upload was waited for, so an admission never waits for a
  // step, however many one step makes (it can wait for one upload's copy: a request admitted
  // and then cancelled before the step that read its upload was waited for frees its slot,
  // and the next admission may take it at once; a ring of 4 areas shared by every slot made the
  // 5th admission of a step wait for the pipelined step in flight: the device then idled).
  PinnedBuffer penalty_host_;  // [num_penalty_slots, penalty_stride_] bytes
  size_t penalty_stride_ = 0;
  std::vector<cudaEvent_t> penalty_done_;  // [num_penalty_slots]
  // [num_penalty_slots] the number of the step the slot's last upload was queued before
  // (steps are numbered by Launch from 1; 0: no upload).
  std::vector<int64_t> penalty_before_step_;
  int64_t steps_launched_ = 0;  // successful Launches so far
  int64_t steps_waited_ = 0;    // the number of the last step Wait completed

  KvCacheShape cache_shape_;
  std::array<DeviceBuffer, kNumLayerGroups> cache_;  // [blocks, layers_in_group, B, row] dtype

  // The steps launched and not waited for, oldest first (at most kStaging), each with the
  // staging buffers and event it uses.
  struct InFlight {
    DevicePlan plan;
    int buffer = 0;
    int64_t number = 0;  // steps_launched_ at its Launch
  };
  std::deque<InFlight> in_flight_;
  // ChainableSlots of the last successful Launch: the sampled row a chained slot names.
  std::vector<int32_t> last_chainable_;
  // Decode-step graphs by GraphKeyOf (at most kMaxGraphs; later shapes run ungraphed), each
  // with the bytes of step arrays it uploads. They name the workspace of Prepare and the
  // caches of AllocateCache, which drop them.
  struct StepGraph {
    cudaGraphExec_t exec = nullptr;
    size_t bytes = 0;
  };
  static constexpr int kMaxGraphs = 128;
  bool use_graphs_ = true;
  std::map<int, StepGraph> graphs_;
};

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
