// The CUDA backend's decode steps as CUDA graphs (CudaBackend::set_graphs) against the same
// steps issued call by call, on cuda-sim in float32 with the golden models: the same tokens,
// logprobs and top logprobs bit for bit, greedy and seeded sampling with penalties, one and
// several sequences, batch sizes that change from step to step (several graphs) and a
// Prepare that drops them.
#include <memory>
#include <string>
#include <vector>

#include "engine/cuda/cuda_backend.h"
#include "engine/kv/kv_cache_manager.h"
#include "engine/model/model_weights.h"
#include "engine/serving/sequence_runner.h"
#include "engine/weights/checkpoint.h"
#include "gtest/gtest.h"
#include "tests/testing/golden.h"
#include "tests/testing/golden_cuda_sim.h"

namespace dcf {
namespace {

std::unique_ptr<cuda::CudaBackend> LoadCudaSim(const std::string& model, bool graphs) {
  std::unique_ptr<cuda::CudaBackend> backend = testing::LoadGoldenCudaSim(model);
  if (backend == nullptr) return nullptr;
  backend->set_graphs(graphs);
  EXPECT_EQ(backend->graphs(), graphs);
  return backend;
}

class DecodeGraphTest : public ::testing::TestWithParam<std::string> {};

// SequenceRunner's greedy decoding: every generated token after the first is a graphed
// decode step of one sequence (one graph, replayed at every position).
TEST_P(DecodeGraphTest, GreedyEqualsUngraphed) {
  const testing::Golden golden = testing::LoadGolden(GetParam());
  GreedyResult results[2];
  for (const bool graphs : {false, true}) {
    std::unique_ptr<cuda::CudaBackend> backend = LoadCudaSim(GetParam(), graphs);
    ASSERT_NE(backend, nullptr);
    auto runner = SequenceRunner::Create(backend.get());
    ASSERT_TRUE(runner.ok()) << runner.status();
    auto r = (*runner)->Greedy(golden.prompt, 24, 16);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(backend->num_graphs(), graphs ? 1 : 0);
    results[graphs] = *std::move(r);
  }
  ASSERT_EQ(results[0].tokens.size(), 24u);
  EXPECT_EQ(results[1].tokens, results[0].tokens);
  ASSERT_EQ(results[1].logprobs.size(), results[0].logprobs.size());
  for (size_t i = 0; i < results[0].logprobs.size(); ++i) {
    EXPECT_EQ(results[1].logprobs[i], results[0].logprobs[i]) << "token " << i;
  }
}

// Three sequences of different lengths prefilled in one step, then decoded together with
// seeded sampling, penalties (slots, so the sampled ids are recorded on the device), logprobs
// and top logprobs; after 6 steps the middle one stops (batch 3 -> 2: a second graph), and
// a second Prepare in the middle drops the graphs (they named the old workspace).
TEST_P(DecodeGraphTest, SampledBatchWithPenaltiesEqualsUngraphed) {
  struct Run {
    std::vector<StepOutput> outputs;
  };
  Run runs[2];
  for (const bool graphs : {false, true}) {
    std::unique_ptr<cuda::CudaBackend> backend = LoadCudaSim(GetParam(), graphs);
    ASSERT_NE(backend, nullptr);
    const ModelConfig& c = backend->config();
    const int B = 4, context_blocks = (c.max_positions + B - 1) / B;
    StepLimits limits;
    limits.max_tokens = 64;
    limits.max_seqs = 4;
    limits.max_logit_rows = 0;
    limits.blocks_per_seq = context_blocks;
    limits.num_penalty_slots = 4;
    KvCacheShape shape;
    shape.block_size = B;
    shape.window = c.window_size;
    shape.num_blocks = {4 * context_blocks, 4 * context_blocks};
    KvCacheManager manager(shape);
    auto prepare = [&]() {
      ASSERT_TRUE(backend->Prepare(limits).ok());
      ASSERT_TRUE(backend->AllocateCache(shape).ok());
    };
    prepare();
    std::vector<SequenceKv> seqs(3);
    std::vector<std::vector<int32_t>> pending(3);
    std::vector<int> steps_taken(3, 0);
    for (int s = 0; s < 3; ++s) {
      for (int i = 0; i < 5 + 7 * s; ++i) pending[s].push_back((i * 31 + 17 * s + 3) % c.vocab_size);
      ASSERT_TRUE(backend->SetPenaltyState(s, pending[s], {}).ok());
    }
    std::vector<bool> live = {true, true, true};
    for (int step = 0; step < 14; ++step) {
      if (step == 6) live[1] = false;
      if (step == 9) {
        EXPECT_EQ(backend->num_graphs(), graphs ? 2 : 0) << "batches of 3 and of 2";
        // The cache is reallocated too: start the live sequences over from what they hold.
        prepare();
        for (int s = 0; s < 3; ++s) {
          if (!live[s]) continue;
          ASSERT_TRUE(backend->SetPenaltyState(s, pending[s], {}).ok());
        }
        // Their cached rows are gone with the old cache: feed each its whole history again.
        for (int s = 0; s < 3; ++s) {
          manager.Free(seqs[s]);
          seqs[s] = SequenceKv();
        }
      }
      StepBatch batch;
      batch.Reset(context_blocks);
      std::vector<int> in_batch;
      for (int s = 0; s < 3; ++s) {
        if (!live[s]) continue;
        std::vector<int32_t> feed(pending[s].begin() + seqs[s].num_tokens, pending[s].end());
        const int new_len = seqs[s].num_tokens + static_cast<int>(feed.size());
        ASSERT_TRUE(manager.Reserve(seqs[s], new_len).ok());
        SamplingRow row;
        row.params.temperature = 0.9f;
        row.params.top_k = 20;
        row.params.repetition_penalty = 1.3f;
        row.params.presence_penalty = 0.2f;
        row.seed = 1000 + s;
        row.step = steps_taken[s];
        row.penalty_slot = s;
        row.logprob = true;
        row.top_logprobs = 3;
        batch.AddSequence(feed, seqs[s], true, row, false);
        in_batch.push_back(s);
      }
      StepOutput out;
      const absl::Status st = backend->Step(batch, &out);
      ASSERT_TRUE(st.ok()) << st;
      for (size_t i = 0; i < in_batch.size(); ++i) {
        const int s = in_batch[i];
        manager.Commit(seqs[s], static_cast<int>(pending[s].size()));
        ASSERT_GE(out.tokens[i], 0);
        pending[s].push_back(out.tokens[i]);
        ++steps_taken[s];
      }
      runs[graphs].outputs.push_back(std::move(out));
    }
    EXPECT_EQ(backend->num_graphs(), graphs ? 1 : 0) << "batches of 2 since the Prepare";
    for (SequenceKv& s : seqs) manager.Free(s);
  }
  ASSERT_EQ(runs[1].outputs.size(), runs[0].outputs.size());
  for (size_t i = 0; i < runs[0].outputs.size(); ++i) {
    const StepOutput &a = runs[0].outputs[i], &b = runs[1].outputs[i];
    EXPECT_EQ(b.tokens, a.tokens) << "step " << i;
    EXPECT_EQ(b.logprobs, a.logprobs) << "step " << i;
    EXPECT_EQ(b.top_tokens, a.top_tokens) << "step " << i;
    EXPECT_EQ(b.top_logprobs, a.top_logprobs) << "step " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, DecodeGraphTest,
                         ::testing::Values("dcformer-f32-short-prompt", "dcpythia-f16-bin"),
                         testing::GoldenParamName);

}  // namespace
}  // namespace dcf
