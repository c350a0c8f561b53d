// CpuBackend::Forward with several sequences per call (the path the scheduler uses) against
// each sequence run alone, for several block sizes; and its argument checking.
#include "engine/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>

#include "engine/model/model_loader.h"
#include "engine/model/sequence_runner.h"
#include "gtest/gtest.h"
#include "tests/testing/golden.h"

namespace dcf {
namespace {

struct Param {
  std::string model;
  int block_size;
};

void PrintTo(const Param& p, std::ostream* os) { *os << p.model << " B=" << p.block_size; }

class MultiSpanTest : public ::testing::TestWithParam<Param> {};

TEST_P(MultiSpanTest, BatchedSpansEqualEachSequenceAlone) {
  auto model = LoadModel(testing::GoldenDir(GetParam().model));
  ASSERT_TRUE(model.ok()) << model.status();
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
  ASSERT_TRUE(model->backend->AllocateCache(shape).ok());
  KvCacheManager manager(shape);
  std::vector<SequenceKv> kv(3);
  std::vector<std::vector<float>> got(3);
  // Mixed prefill chunks and single tokens; span order reversed every other step.
  const int chunks[3][6] = {{7, 1, 3, 17, 1, 2}, {1, 5, 9, 1, 1, 20}, {3, 3, 1, 11, 2, 1}};
  for (int step = 0;; ++step) {
    std::vector<ForwardSpan> spans;
    std::vector<int> owner;
    for (int s = 0; s < 3; ++s) {
      const int n0 = kv[s].num_tokens, total = static_cast<int>(seqs[s].size());
      if (n0 >= total) continue;
      const int c = std::min(chunks[s][step % 6], total - n0);
      ASSERT_TRUE(manager.Reserve(kv[s], n0 + c).ok());
      spans.push_back({&kv[s], n0, absl::MakeConstSpan(seqs[s]).subspan(n0, c), true});
      owner.push_back(s);
    }
    if (spans.empty()) break;
    if (step % 2 == 1) {
      std::reverse(spans.begin(), spans.end());
      std::reverse(owner.begin(), owner.end());
    }
    std::vector<float> logits(static_cast<size_t>(NumLogitRows(spans)) * V);
    ASSERT_TRUE(model->backend->Forward(spans, absl::MakeSpan(logits)).ok());
    size_t offset = 0;
    for (size_t i = 0; i < spans.size(); ++i) {
      const size_t n = spans[i].tokens.size() * V;
      got[owner[i]].insert(got[owner[i]].end(), logits.begin() + offset,
                           logits.begin() + offset + n);
      offset += n;
      manager.Commit(kv[owner[i]], spans[i].start_pos + static_cast<int>(spans[i].tokens.size()));
      EXPECT_LE(kv[owner[i]].HeldBlocks(LayerGroup::kWindow), manager.WindowBlockBound());
    }
  }
  for (int s = 0; s < 3; ++s) {
    ASSERT_EQ(got[s].size(), want[s].size());
    double worst = 0;
    for (size_t i = 0; i < got[s].size(); ++i) {
      worst = std::max(worst, static_cast<double>(std::abs(got[s][i] - want[s][i])));
    }
    EXPECT_LT(worst, 1e-4) << "sequence " << s;
  }
  for (SequenceKv& k : kv) manager.Free(k);
  EXPECT_EQ(manager.num_used(LayerGroup::kGlobal), 0);
  EXPECT_EQ(manager.num_used(LayerGroup::kWindow), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Golden, MultiSpanTest,
    ::testing::Values(Param{"dcformer-f32-long-prompt", 1}, Param{"dcformer-f32-long-prompt", 5},
                      Param{"dcformer-f32-long-prompt", 16}, Param{"dcpythia-f16-bin", 4}),
    [](const ::testing::TestParamInfo<Param>& info) {
      std::string n = info.param.model + "_B" + std::to_string(info.param.block_size);
      std::replace(n.begin(), n.end(), '-', '_');
      return n;
    });

TEST(CpuBackendTest, RejectsBadCacheShapesAndSpans) {
  auto model = LoadModel(testing::GoldenDir("dcformer-f32-short-prompt"));
  ASSERT_TRUE(model.ok());
  Backend& backend = *model->backend;
  KvCacheShape shape;
  shape.block_size = 4;
  shape.window = 16;
  shape.num_blocks = {-1, 8};
  EXPECT_EQ(backend.AllocateCache(shape).code(), absl::StatusCode::kInvalidArgument);
  shape.num_blocks = {8, 8};
  shape.window = 4;  // the model's window is 16
  EXPECT_EQ(backend.AllocateCache(shape).code(), absl::StatusCode::kInvalidArgument);
  shape.window = 16;
  ASSERT_TRUE(backend.AllocateCache(shape).ok());

  KvCacheManager manager(shape);
  SequenceKv kv;
  ASSERT_TRUE(manager.Reserve(kv, 3).ok());
  const std::vector<int32_t> tokens = {1, 2, 3};
  std::vector<float> logits(300);
  // start_pos must equal the tokens the sequence already holds.
  ForwardSpan wrong_start{&kv, 2, tokens, false};
  EXPECT_EQ(backend.Forward({&wrong_start, 1}, absl::MakeSpan(logits)).code(),
            absl::StatusCode::kInvalidArgument);
  // Token ids outside the vocabulary.
  const std::vector<int32_t> bad_ids = {1, 300, 2};
  ForwardSpan bad{&kv, 0, bad_ids, false};
  EXPECT_EQ(backend.Forward({&bad, 1}, absl::MakeSpan(logits)).code(),
            absl::StatusCode::kInvalidArgument);
  // A logits buffer of the wrong size.
  ForwardSpan ok{&kv, 0, tokens, false};
  std::vector<float> small(10);
  EXPECT_FALSE(backend.Forward({&ok, 1}, absl::MakeSpan(small)).ok());
  // Positions without reserved blocks.
  SequenceKv unreserved;
  ForwardSpan missing{&unreserved, 0, tokens, false};
  EXPECT_EQ(backend.Forward({&missing, 1}, absl::MakeSpan(logits)).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(backend.Forward({&ok, 1}, absl::MakeSpan(logits)).ok());
  manager.Free(kv);
}

}  // namespace
}  // namespace dcf
