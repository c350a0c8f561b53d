// What every backend must do, run for each backend this machine has: the CPU oracle and the
// CUDA backend's kernels on the SIMT emulator (cuda-sim, float32). One binary
// (backend_conformance_test) of several files, helpers in backend_conformance_util.h.
//
// This file: steps with several sequences per batch (the path the scheduler uses: mixed
// prefill chunks and decode tokens, block sizes 1/5/16, window layers) against each sequence
// run alone; 16-bit weights and KV cache on the CPU; SequenceRunner's step timing; cuda-sim's
// KV cache dtype, quantized decode rows and GEMV path.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "engine/backends/backend_factory.h"
#include "engine/model/random_model.h"
#include "engine/serving/sequence_runner.h"
#include "gtest/gtest.h"
#include "tests/testing/golden.h"
#include "tests/testing/temp_dir.h"
#include "tests/unit/backends/backend_conformance_util.h"

namespace dcf::conformance_test {
namespace {

struct Param {
  BackendKind backend;
  std::string model;
  int block_size;
  DType kv = DType::kF32;  // the KV cache dtype (cpu)
};

void PrintTo(const Param& p, std::ostream* os) {
  *os << BackendKindName(p.backend) << " " << p.model << " B=" << p.block_size << " kv "
      << DTypeName(p.kv);
}

class MultiSpanTest : public ::testing::TestWithParam<Param> {};

TEST_P(MultiSpanTest, BatchedSpansEqualEachSequenceAlone) {
  auto model = Load(GetParam().model, GetParam().backend, GetParam().kv);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ(model->backend->info().kv_cache_dtype, GetParam().kv);
  const int V = model->config.vocab_size;
  const int B = GetParam().block_size;
  const testing::Golden g = testing::LoadGolden(GetParam().model);
  // Three sequences of different lengths: the golden one and two derived from it.
  std::vector<std::vector<int32_t>> seqs(3);
  seqs[0] = g.sequence;
  for (int32_t t : g.sequence) seqs[1].push_back((t * 7 + 3) % V);
  for (size_t i = 0; i < g.sequence.size() / 2 + 3; ++i) {
    seqs[2].push_back((g.sequence[i] * 13 + 1) % V);
  }

  // Reference: each sequence alone, one token at a time.
  std::vector<std::vector<float>> want(3);
  for (int s = 0; s < 3; ++s) {
    auto runner = SequenceRunner::Create(model->backend.get(), B);
    ASSERT_TRUE(runner.ok());
    ASSERT_TRUE((*runner)->Append(seqs[s], 1, &want[s]).ok());
  }

  KvCacheShape shape;
  shape.block_size = B;
  shape.window = model->config.window_size;
  shape.num_blocks = {600, 600};
  StepLimits limits;
  limits.max_tokens = 512;
  limits.max_seqs = 3;
  limits.max_logit_rows = 512;
  limits.blocks_per_seq = (model->config.max_positions + B - 1) / B;
  ASSERT_TRUE(model->backend->Prepare(limits).ok());
  ASSERT_TRUE(model->backend->AllocateCache(shape).ok());
  KvCacheManager manager(shape);
  std::vector<SequenceKv> kv(3);
  std::vector<std::vector<float>> got(3);
  StepBatch batch;
  StepOutput out;
  // Mixed prefill chunks and single tokens; sequence order reversed every other step.
  const int chunks[3][6] = {{7, 1, 3, 17, 1, 2}, {1, 5, 9, 1, 1, 20}, {3, 3, 1, 11, 2, 1}};
  for (int step = 0;; ++step) {
    std::vector<int> owner;
    for (int s = 0; s < 3; ++s) {
      if (kv[s].num_tokens < static_cast<int>(seqs[s].size())) owner.push_back(s);
    }
    if (owner.empty()) break;
    if (step % 2 == 1) std::reverse(owner.begin(), owner.end());
    batch.Reset(limits.blocks_per_seq);
    std::vector<int> count;
    for (int s : owner) {
      const int n0 = kv[s].num_tokens, total = static_cast<int>(seqs[s].size());
      const int c = std::min(chunks[s][step % 6], total - n0);
      ASSERT_TRUE(manager.Reserve(kv[s], n0 + c).ok());
      batch.AddSequence(absl::MakeConstSpan(seqs[s]).subspan(n0, c), kv[s], false, {}, true);
      count.push_back(c);
    }
    ASSERT_TRUE(model->backend->Step(batch, &out).ok());
    size_t offset = 0;
    for (size_t i = 0; i < owner.size(); ++i) {
      const size_t n = static_cast<size_t>(count[i]) * V;
      got[owner[i]].insert(got[owner[i]].end(), out.logits.begin() + offset,
                           out.logits.begin() + offset + n);
      offset += n;
      manager.Commit(kv[owner[i]], kv[owner[i]].num_tokens + count[i]);
      EXPECT_LE(kv[owner[i]].HeldBlocks(LayerGroup::kWindow), manager.WindowBlockBound());
    }
  }
  for (int s = 0; s < 3; ++s) {
    ASSERT_EQ(got[s].size(), want[s].size());
    double worst = 0;
    for (size_t i = 0; i < got[s].size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::abs(got[s][i] - want[s][i])));
    }
    if (GetParam().backend == BackendKind::kCpu) {
      // Bit for bit: every CPU kernel computes a token's row the same way whatever else is in
      // the batch or the chunk (packed_matrix.h, dcmha.h), so batching changes nothing; with
      // a 16-bit cache too, since a chunk's own rows are rounded as the cached ones are.
      EXPECT_EQ(worst, 0.0) << "sequence " << s;
    } else {
      // The CUDA GEMMs (cuBLASLt; OpenBLAS on the emulator) pick their reduction order by
      // shape, so a row's logits move by float rounding with the batch.
      EXPECT_LT(worst, 1e-4) << "sequence " << s;
    }
  }
  for (SequenceKv& k : kv) manager.Free(k);
  EXPECT_EQ(manager.num_used(LayerGroup::kGlobal), 0);
  EXPECT_EQ(manager.num_used(LayerGroup::kWindow), 0);
}

std::vector<Param> MultiSpanParams() {
  std::vector<Param> params;
  for (BackendKind k : Backends()) {
    params.push_back({k, "dcformer-f32-long-prompt", 1});
    params.push_back({k, "dcformer-f32-long-prompt", 5});
    params.push_back({k, "dcformer-f32-long-prompt", 16});
    params.push_back({k, "dcpythia-f16-bin", 4});
  }
  for (DType kv : {DType::kBF16, DType::kF16}) {
    params.push_back({BackendKind::kCpu, "dcformer-f32-long-prompt", 1, kv});
    params.push_back({BackendKind::kCpu, "dcformer-f32-long-prompt", 5, kv});
    params.push_back({BackendKind::kCpu, "dcformer-f32-long-prompt", 16, kv});
    params.push_back({BackendKind::kCpu, "dcpythia-f16-bin", 4, kv});
  }
  return params;
}

INSTANTIATE_TEST_SUITE_P(Golden, MultiSpanTest, ::testing::ValuesIn(MultiSpanParams()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           std::string n = KindName(info.param.backend) + "_" + info.param.model +
                                           "_B" + std::to_string(info.param.block_size);
                           if (info.param.kv != DType::kF32) {
                             n += "_kv" + std::string(DTypeName(info.param.kv));
                           }
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

// A 16-bit checkpoint run with its weights kept in 16 bits (widened inside the kernels) gives
// bit for bit the logits of the same checkpoint widened to float32 at load: widening is
// exact and every kernel multiplies in the same order whatever the weight dtype.
TEST(CpuBackendTest, SixteenBitWeightsKeptEqualWidenedAtLoad) {
  for (const DType dtype : {DType::kF16, DType::kBF16}) {
    testing::TempDir dir;
    // 40 = 32 + 8 outputs per matrix: a partial panel; 300 vocab rows likewise.
    ASSERT_TRUE(
        WriteRandomModel(dir.path(), SmallDcFormerConfig(64, 2, 4, 40, 300, 64, 8), dtype, 11)
            .ok());
    std::vector<std::vector<float>> logits(2);
    for (int widen = 0; widen < 2; ++widen) {
      BackendOptions o;
      o.kind = BackendKind::kCpu;
      if (widen) o.dtype = DType::kF32;
      auto model = LoadModel(dir.path(), o);
      ASSERT_TRUE(model.ok()) << model.status();
      EXPECT_EQ(model->backend->info().dtype, widen ? DType::kF32 : dtype);
      auto runner = SequenceRunner::Create(model->backend.get());
      ASSERT_TRUE(runner.ok());
      std::vector<int32_t> tokens;
      for (int i = 0; i < 20; ++i) tokens.push_back((i * 37 + 5) % 300);
      ASSERT_TRUE((*runner)->Append(tokens, 7, &logits[widen]).ok());
    }
    ASSERT_EQ(logits[0].size(), 20u * 300);
    ASSERT_EQ(logits[1].size(), logits[0].size());
    for (size_t i = 0; i < logits[0].size(); ++i) {
      ASSERT_EQ(logits[0][i], logits[1][i]) << DTypeName(dtype) << " at " << i;
    }
  }
}

// A step runs on a team of the OpenMP threads (engine/cpu/team.h): its products, attention
// and sampling split between 1, 2 or 3 threads give the same bits, for float32, weight-only
// int8 and int8 x int8 matrices (the shared quantized rows), a prefill in chunks, steps of one
// token (the one query split between the threads) and greedy decoding. Products here are
// large enough to split (dim 256, vocabulary 1,000).
TEST(CpuBackendTest, LogitsDoNotDependOnTheThreadCount) {
  testing::TempDir dir;
  ASSERT_TRUE(WriteRandomModel(dir.path(), SmallDcFormerConfig(256, 2, 4, 512, 1000, 128, 16),
                               DType::kF32, 17)
                  .ok());
  // OpenMP's thread count as it was, whatever fails below.
  struct RestoreThreads {
    int threads = omp_get_max_threads();
    ~RestoreThreads() { omp_set_num_threads(threads); }
  } restore;
  std::vector<int32_t> tokens;
  for (int i = 0; i < 40; ++i) tokens.push_back((i * 37 + 5) % 1000);
  for (const auto& [weights, activations] :
       {std::pair{WeightQuant::kNone, ActivationQuant::kFloat32},
        std::pair{WeightQuant::kInt8, ActivationQuant::kFloat32},
        std::pair{WeightQuant::kInt8, ActivationQuant::kInt8}}) {
    std::vector<float> want_logits;
    std::vector<int32_t> want_tokens;
    std::vector<float> want_logprobs;
    for (const int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      BackendOptions o;
      o.kind = BackendKind::kCpu;
      o.weight_quant = weights;
      o.activation_quant = activations;
      auto model = LoadModel(dir.path(), o);
      ASSERT_TRUE(model.ok()) << model.status();
      auto runner = SequenceRunner::Create(model->backend.get());
      ASSERT_TRUE(runner.ok());
      std::vector<float> logits;  // the first 32 tokens in chunks of 9, the rest one by one
      const auto span = absl::MakeConstSpan(tokens);
      ASSERT_TRUE((*runner)->Append(span.subspan(0, 32), 9, &logits).ok());
      ASSERT_TRUE((*runner)->Append(span.subspan(32), 1, &logits).ok());
      (*runner)->Reset();
      auto greedy = (*runner)->Greedy(tokens, 12, 16);
      ASSERT_TRUE(greedy.ok()) << greedy.status();
      const std::string name = std::string(WeightQuantName(weights)) + "/" +
                               ActivationQuantName(activations) + " on " +
                               std::to_string(threads) + " threads";
      if (threads == 1) {
        want_logits = logits;
        want_tokens = greedy->tokens;
        want_logprobs = greedy->logprobs;
        continue;
      }
      ASSERT_EQ(logits.size(), want_logits.size()) << name;
      for (size_t i = 0; i < logits.size(); ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(logits[i]), std::bit_cast<uint32_t>(want_logits[i]))
            << name << " at " << i;
      }
      EXPECT_EQ(greedy->tokens, want_tokens) << name;
      ASSERT_EQ(greedy->logprobs.size(), want_logprobs.size()) << name;
      for (size_t i = 0; i < want_logprobs.size(); ++i) {
        EXPECT_EQ(std::bit_cast<uint32_t>(greedy->logprobs[i]),
                  std::bit_cast<uint32_t>(want_logprobs[i]))
            << name << " logprob " << i;
      }
    }
  }
}

// A 16-bit KV cache (--kv-cache-dtype): half the bytes per block, so the same memory plans
// twice the blocks; the rounding is really applied (the logits move) and small (relative to
// the largest logit: below 5% for bfloat16, 1% for float16 on this random model; measured
// 2.5% and 0.25%, the 8x of their 3 fewer significant bits).
TEST(CpuBackendTest, SixteenBitKvCacheHalvesBlockBytesAndStaysClose) {
  testing::TempDir dir;
  ASSERT_TRUE(
      WriteRandomModel(dir.path(), SmallDcFormerConfig(64, 2, 4, 40, 300, 64, 8), DType::kF32, 5)
          .ok());
  std::vector<int32_t> tokens;
  for (int i = 0; i < 40; ++i) tokens.push_back((i * 37 + 5) % 300);
  std::vector<float> f32_logits;
  size_t f32_block_bytes = 0;
  for (const DType kv : {DType::kF32, DType::kBF16, DType::kF16}) {
    BackendOptions o;
    o.kind = BackendKind::kCpu;
    o.kv_cache_dtype = kv;
    auto model = LoadModel(dir.path(), o);
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_EQ(model->backend->info().kv_cache_dtype, kv);
    const size_t block_bytes = model->backend->BytesPerBlock(LayerGroup::kGlobal, 16);
    auto runner = SequenceRunner::Create(model->backend.get());
    ASSERT_TRUE(runner.ok());
    std::vector<float> logits;
    ASSERT_TRUE((*runner)->Append(tokens, 9, &logits).ok());
    if (kv == DType::kF32) {
      f32_logits = logits;
      f32_block_bytes = block_bytes;
      continue;
    }
    EXPECT_EQ(2 * block_bytes, f32_block_bytes) << DTypeName(kv);
    ASSERT_EQ(logits.size(), f32_logits.size());
    double worst = 0, scale = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::abs(logits[i] - f32_logits[i])));
      scale = std::max(scale, static_cast<double>(std::abs(f32_logits[i])));
    }
    EXPECT_GT(worst, 0.0) << DTypeName(kv) << ": the cache rows were not rounded";
    // bfloat16 keeps 8 significant bits (relative rounding 2^-9), float16 11 (2^-12).
    EXPECT_LT(worst, (kv == DType::kBF16 ? 5e-2 : 1e-2) * scale)
        << DTypeName(kv) << " logits up to " << scale;
  }
}

// GreedyResult's timings (dcformer-decode-bench's source): a 1024-token prompt then 4 decode
// steps, each timed on its own. The case where the bench once printed 4e9 tokens/s (it
// subtracted a separately timed prefill from the whole run): every decode step must be
// positive and shorter than the prompt's 1024 tokens, and the timed parts must fit in the
// run's wall time.
TEST(SequenceRunnerTest, GreedyTimesEachDecodeStepOnItsOwn) {
  testing::TempDir dir;
  ASSERT_TRUE(
      WriteRandomModel(dir.path(), SmallDcFormerConfig(64, 2, 4, 128, 300, 1100, 0), DType::kF32, 3)
          .ok());
  BackendOptions o;
  o.kind = BackendKind::kCpu;
  auto model = LoadModel(dir.path(), o);
  ASSERT_TRUE(model.ok()) << model.status();
  auto runner = SequenceRunner::Create(model->backend.get());
  ASSERT_TRUE(runner.ok());
  std::vector<int32_t> prompt;
  for (int i = 0; i < 1024; ++i) prompt.push_back((i * 37 + 5) % 300);
  const auto t0 = std::chrono::steady_clock::now();
  auto res = (*runner)->Greedy(prompt, 5, 512);
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(res.ok()) << res.status();
  ASSERT_EQ(res->tokens.size(), 5u);
  ASSERT_EQ(res->decode_step_seconds.size(), 4u);
  EXPECT_GT(res->prompt_seconds, 0);
  double decode = 0;
  for (double s : res->decode_step_seconds) {
    EXPECT_GT(s, 0);
    EXPECT_LT(s, res->prompt_seconds) << "one decode token took longer than 1024 prompt tokens";
    decode += s;
  }
  EXPECT_LE(res->prompt_seconds + decode, wall);
}

// The CUDA backend keeps its cache in its compute dtype: any other --kv-cache-dtype is an
// error that says so, before anything is allocated.
TEST(CudaSimBackendTest, RefusesAKvCacheDtypeOtherThanItsDtype) {
  if (!CudaSimBackendBuilt()) GTEST_SKIP() << "this build has no cuda-sim backend";
  BackendOptions o;
  o.kind = BackendKind::kCudaSim;
  o.dtype = DType::kF32;
  o.kv_cache_dtype = DType::kBF16;
  auto refused = LoadModel(testing::GoldenDir("dcformer-f32-long-prompt"), o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("--kv-cache-dtype bfloat16"), std::string::npos)
      << refused.status();
  o.kv_cache_dtype = DType::kF32;
  auto same = LoadModel(testing::GoldenDir("dcformer-f32-long-prompt"), o);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->backend->info().kv_cache_dtype, DType::kF32);
}

// int8 and fp8 weights on the GEMV path (DCF_SIM_GEMV=1, as on a GPU), bfloat16: decode
// steps of three sequences give each sequence the logits it gets alone, bit for bit (the
// quantized GEMV's sums do not depend on the rows beside them, gemv.h), token after token.
// A small random model (2 layers, a window layer and a global one) keeps the emulated GEMV
// grids cheap: ~10 s.
TEST(CudaSimBackendTest, QuantizedDecodeRowsDoNotDependOnTheBatch) {
  if (!CudaSimBackendBuilt()) GTEST_SKIP() << "this build has no cuda-sim backend";
  testing::TempDir dir;
  ASSERT_TRUE(
      WriteRandomModel(dir.path(), SmallDcFormerConfig(64, 2, 4, 96, 64, 64, 4), DType::kBF16, 3)
          .ok());
  for (const WeightQuant quant : {WeightQuant::kInt8, WeightQuant::kFp8}) {
    SCOPED_TRACE(WeightQuantName(quant));
    BackendOptions o;
    o.kind = BackendKind::kCudaSim;
    o.dtype = DType::kBF16;
    o.weight_quant = quant;
    setenv("DCF_SIM_GEMV", "1", 1);  // read when the backend is created
    auto model = LoadModel(dir.path(), o);
    unsetenv("DCF_SIM_GEMV");
    ASSERT_TRUE(model.ok()) << model.status();
    ASSERT_EQ(model->backend->info().channel_quant, quant);
    const int V = model->config.vocab_size, kTokens = 4, B = 4;
    std::vector<std::vector<int32_t>> seqs(3);
    for (int s = 0; s < 3; ++s) {
      for (int i = 0; i < kTokens; ++i) seqs[s].push_back((i * 37 + s * 11 + 5) % V);
    }
    std::vector<std::vector<float>> alone(3);
    for (int s = 0; s < 3; ++s) {
      auto runner = SequenceRunner::Create(model->backend.get(), B);
      ASSERT_TRUE(runner.ok());
      ASSERT_TRUE((*runner)->Append(seqs[s], 1, &alone[s]).ok());
    }
    KvCacheShape shape;
    shape.block_size = B;
    shape.window = model->config.window_size;
    shape.num_blocks = {16, 16};
    StepLimits limits;
    limits.max_tokens = 16;
    limits.max_seqs = 3;
    limits.max_logit_rows = 16;
    limits.blocks_per_seq = (model->config.max_positions + B - 1) / B;
    ASSERT_TRUE(model->backend->Prepare(limits).ok());
    ASSERT_TRUE(model->backend->AllocateCache(shape).ok());
    KvCacheManager manager(shape);
    std::vector<SequenceKv> kv(3);
    StepBatch batch;
    StepOutput out;
    for (int t = 0; t < kTokens; ++t) {
      batch.Reset(limits.blocks_per_seq);
      for (int s = 0; s < 3; ++s) {
        ASSERT_TRUE(manager.Reserve(kv[s], t + 1).ok());
        batch.AddSequence(absl::MakeConstSpan(seqs[s]).subspan(t, 1), kv[s], false, {}, true);
      }
      ASSERT_TRUE(model->backend->Step(batch, &out).ok());
      for (int s = 0; s < 3; ++s) {
        EXPECT_EQ(0, std::memcmp(out.logits.data() + static_cast<size_t>(s) * V,
                                 alone[s].data() + static_cast<size_t>(t) * V, V * sizeof(float)))
            << "sequence " << s << " token " << t;
        manager.Commit(kv[s], t + 1);
      }
    }
    for (SequenceKv& k : kv) manager.Free(k);
  }
}

}  // namespace
}  // namespace dcf::conformance_test
