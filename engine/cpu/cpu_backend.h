// The CPU backend: fp32 activations and accumulation, weights kept in their loaded dtype
// (F32, F16 or BF16) and widened inside its own matmul kernels (packed_matrix.h), OpenMP
// threads, the host token sampler. It is the oracle the CUDA backend is tested against, so
// it follows DCFORMER.md literally.
//
// Thread-compatibility: one caller at a time (the engine loop); see backend.h.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "engine/cpu/cpu_profile.h"
#include "engine/cpu/cpu_weights.h"
#include "engine/cpu/large_buffer.h"
#include "engine/cpu/paged_attention.h"
#include "engine/kv/kv_layout.h"
#include "engine/execution/backend.h"
#include "engine/execution/step_plan.h"
#include "engine/model/model_weights.h"
#include "engine/sampling/token_sampler.h"
#include "engine/weights/int8_quant.h"

namespace dcf {

// How CpuBackend::Create builds the backend (the defaults serve a checkpoint as it is).
struct CpuBackendOptions {
  // false skips the DCMHA compose (plain multi-head attention): for benchmarks that price
  // DCMHA, never for serving a DCFormer.
  bool compose = true;
  // int8.group > 0 quantizes the matrices to int8 in groups of that many columns
  // (cpu::PackWeights; 32, 64 or 128, else InvalidArgument). An int8 checkpoint
  // (config.int8_group_size > 0) always gives int8 matrices; a different group is
  // InvalidArgument. int8.activations (with int8 matrices only, else InvalidArgument): their
  // products quantize the activations too (cpu::PackedMatrix::QuantizeInt8, int8 x int8).
  Int8Matrices int8;
  // The dtype of the cache's elements (F32, BF16 or F16): with a 16-bit one every fresh row
  // is rounded (to nearest even) once, before the step uses it, cached or not, so results
  // never depend on chunking, batching or a prefix hit.
  DType kv_cache_dtype = DType::kF32;
};

class CpuBackend final : public Backend {
 public:
  // Takes ownership of the weights and packs them for its kernels: matrices keep their dtype
  // (convert before calling to change it) unless `options` quantizes them, vectors become
  // fp32. InvalidArgument when the config exceeds what the kernels support (n_head > 256) or
  // `options` is invalid for it (above).
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(
      const ModelConfig& config, ModelWeights weights, const CpuBackendOptions& options = {});

  const ModelConfig& config() const override { return config_; }
  BackendInfo info() const override;
  size_t BytesPerBlock(LayerGroup g, int block_size) const override;
  absl::StatusOr<size_t> Prepare(const StepLimits& limits) override;
  absl::Status AllocateCache(const KvCacheShape& shape) override;
  absl::Status SetPenaltyState(int slot, absl::Span<const int32_t> prompt,
                               absl::Span<const int32_t> generated) override;
  // Runs the whole step on the calling thread; Wait hands over the result (of the oldest step
  // not waited for: two results are kept, so a second Launch before the first Wait keeps the
  // first's).
  absl::Status Launch(const StepBatch& batch) override;
  absl::Status Wait(StepOutput* out) override;
  // Samples every marked row of a verifying sequence (step_batch.h): speculative decoding.
  bool VerifiesDrafts() const override { return true; }
  // Chained tokens are read from the previous step's samples, kept from its Launch. Launch
  // computes the step: chaining saves nothing here (LaunchReturnsEarly() is false).
  bool ChainsSteps() const override { return true; }
  // Times the step's matrix products (every layer's, and the output head: a verify step
  // samples every row) for T rows, the best of 3 runs each, and applies MemoryBoundTokens
  // to them. Attention and the vector work, which also grow with T, are left out.
  int MeasureMemoryBoundTokens(int max_tokens) override;

  // Wall time per phase of the steps since the last ResetProfile (benchmarks).
  const cpu::CpuStepProfile& profile() const { return profile_; }
  void ResetProfile() { profile_ = cpu::CpuStepProfile(); }
  // Bytes of weights one decode step reads (every matrix once, one embedding row): the
  // numerator of the memory roofline.
  size_t WeightBytesPerStep() const { return weights_.BytesReadPerToken(); }
  // Flops of the layer matrix products per token (2 x the elements of every layer matrix; the
  // output projection, which a prefill runs for one row, and attention are not counted): the
  // numerator of a prefill's GFLOP/s (benchmarks).
  double MatMulFlopsPerToken() const;

 private:
  CpuBackend(const ModelConfig& config, ModelWeights weights, const CpuBackendOptions& options);

  // The new tokens of one sequence of the batch and its block tables.
  struct SeqView {
    int start_pos = 0;
    int num_tokens = 0;
    int64_t first_token = 0;  // index of its first token in the step
    std::array<const int32_t*, kNumLayerGroups> table{nullptr, nullptr};  // [blocks_per_seq]
  };

  // cpu::MatMul of one weight matrix, its int8 x int8 quantization or packing of x in
  // s_.quant (reserved by Prepare, so a step does not allocate): on its own threads, or on
  // every thread of a step's team.
  void Product(const float* x, int64_t ldx, int64_t rows, const cpu::PackedMatrix& w,
               const float* bias, float* y, int64_t ldy);
  void Product(cpu::Team& team, const float* x, int64_t ldx, int64_t rows,
               const cpu::PackedMatrix& w, const float* bias, float* y, int64_t ldy);

  // Runs the model over the batch and writes the logits of `rows` (step token indices) into
  // s_.logits ([rows, vocab]), then calls then(team). The step runs on one team of threads
  // (cpu/team.h): one OpenMP region a step. AttentionLayer, FeedForward and Sample run on
  // every thread of it; what one thread computes alone, the leader does, and a barrier
  // follows.
  void Forward(const StepBatch& batch, const std::vector<int32_t>& rows,
               absl::FunctionRef<void(cpu::Team&)> then);
  void AttentionLayer(cpu::Team& team, int layer);
  void FeedForward(cpu::Team& team, int layer, const float* h, float* out);
  // Draws the token of every sampling sequence from its row of s_.logits (plan.sample_row).
  // `slots`: batch.slot_offsets(), where each sequence's results go in `result`.
  void Sample(cpu::Team& team, const StepBatch& batch, const LogitRows& plan,
              const std::vector<int32_t>& slots, StepOutput* result);
  // The profile a thread of a step's team times its phases into: its leader's, else none.
  cpu::CpuStepProfile* LeaderProfile(const cpu::Team& team) {
    return team.leader() ? &profile_ : nullptr;
  }

  ModelConfig config_;
  cpu::CpuWeights weights_;
  KvRowLayout layout_;
  const bool compose_;
  const DType kv_dtype_;
  StepLimits limits_;
  KvCacheShape cache_shape_;
  // [blocks, layers_in_group, B, row] of kv_dtype_
  std::array<cpu::LargeBuffer, kNumLayerGroups> cache_;
  std::array<int, kNumLayerGroups> layers_in_group_{0, 0};
  std::vector<PenaltyState> penalty_slots_;  // [num_penalty_slots]
  int team_threads_ = 1;  // threads of a step's team (Prepare)
  std::vector<SamplerScratch> sampler_scratch_;  // one per thread of a step's team
  // The results of the steps launched and not waited for (at most 2): results_[oldest_], then
  // the other one when in_flight_ == 2.
  std::array<StepOutput, 2> results_;
  int oldest_ = 0;
  int in_flight_ = 0;
  // Of the last successful Launch, for the next step's chained tokens: its sampled tokens by
  // output slot (-1 where none) and ChainableSlots.
  std::vector<int32_t> last_tokens_;
  std::vector<int32_t> last_chainable_;
  cpu::CpuStepProfile profile_;

  // Per-step activations, resized to the step's T tokens.
  struct Scratch {
    std::vector<SeqView> seqs;                 // [S]
    std::vector<int32_t> tokens;               // [T] the step's ids, chained ones resolved
    std::vector<cpu::PagedSequence> paged;     // [S] for the current layer's group
    std::vector<int32_t> seq_of;               // [T]
    std::vector<int64_t> pos;                  // [T]
    std::vector<float> x, a, y;                // [T, E]
    std::vector<float> qkv;                    // [T, FusedInputWidth] a in_proj^T
    std::vector<float> dw;                     // [T, C, 2I, N]
    std::vector<float> rows;                   // [T, row]  fresh K | V | key terms
    std::vector<uint16_t> rows16;              // [T, row]  the same rounded to a 16-bit
                                               //   kv_dtype_ (empty for F32)
    std::vector<float> o;                      // [T, E]
    std::vector<float> up;                     // [T, 2F] (dcformer) or [T, F]
    std::vector<float> act;                    // [T, F]
    std::vector<float> rope_cos, rope_sin;     // [T, r/2]
    std::vector<float> logits;                 // [rows, V]
    cpu::MatMulScratch quant;                  // the products' quantized or packed x
    cpu::PagedAttentionWork attention;         // the team's shared attention plan
  } s_;
};

}  // namespace dcf
