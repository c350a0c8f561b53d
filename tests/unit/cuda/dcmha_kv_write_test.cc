// LaunchKvCacheWrite: which rows it writes (every new position whose block-table entry is
// present: every new position of a global layer; of a window layer those in the blocks it
// keeps after the step, or, with every logical block given a physical one as prefix caching
// does, every new position), their contents in each cache dtype, that nothing else in the
// cache changes, and that LaunchDcmha reads what it wrote. Built twice
// (dcf_add_cuda_test): emulator (label unit) and GPU (label gpu).
#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "engine/cuda/dcmha_attention.h"
#include "gtest/gtest.h"
#include "tests/unit/cuda/dcmha_test_util.h"

namespace dcf::cuda_test {
namespace {

struct WriteCase {
  int window;
  int block_size;
  ElemType dtype;
  bool all_blocks;
};

std::string Describe(const WriteCase& c) {
  const char* dtype = c.dtype == ElemType::kF32    ? "f32"
                      : c.dtype == ElemType::kBF16 ? "bf16"
                                                   : "f16";
  return std::string(c.window > 0 ? "window" : "global") + "_B" + std::to_string(c.block_size) +
         "_" + dtype + (c.all_blocks ? "_allblocks" : "");
}
void PrintTo(const WriteCase& c, std::ostream* os) { *os << Describe(c); }
std::string WriteName(const ::testing::TestParamInfo<WriteCase>& info) {
  return Describe(info.param);
}

class KvWriteTest : public ::testing::TestWithParam<WriteCase> {};

TEST_P(KvWriteTest, WritesExactlyTheRowsWithABlock) {
  const WriteCase& c = GetParam();
  Shape shape;
  shape.window = c.window;
  shape.block_size = c.block_size;
  shape.cache_dtype = c.dtype;
  // A decode token, a chunk from 0 longer than the window, a mid-sequence chunk, a chunk
  // that ends exactly one window after its start.
  const Scenario sc(shape, {{9, 1}, {0, 23}, {14, 6}, {3, 16}}, 21 + c.block_size, c.all_blocks);
  auto d = sc.Upload();
  ASSERT_TRUE(CudaOk(cuda::LaunchKvCacheWrite(d->step, d->args, nullptr)));
  ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
  const std::vector<uint8_t> after = d->cache.ToHost();
  std::vector<uint8_t> want = sc.cache_bytes();
  const int row = sc.layout().row_floats();
  int written = 0;
  for (int s = 0; s < sc.num_seqs(); ++s) {
    const SeqSpec& q = sc.seqs()[s];
    for (int p = q.start; p < q.start + q.n; ++p) {
      const int64_t at = sc.CacheIndex(s, p, Scenario::kLayer);
      if (sc.Kept(s, p)) {
        ASSERT_GE(at, 0) << "seq " << s << " pos " << p;
      }
      if (at < 0) continue;  // a window position without a block: not written
      for (int e = 0; e < row; ++e) StoreElem(c.dtype, want, at + e, sc.Row(s, p)[e]);
      ++written;
    }
  }
  EXPECT_GT(written, 0);
  // Byte-exact: kept rows converted with round-to-nearest-even, all else untouched (NaN).
  ASSERT_EQ(after.size(), want.size());
  const int elem = cuda::ElemBytes(c.dtype);
  for (size_t i = 0; i < want.size(); i += elem) {
    ASSERT_EQ(std::memcmp(&after[i], &want[i], elem), 0)
        << "element " << i / elem << " (row " << i / elem / row << ", offset " << i / elem % row
        << ")";
  }
}

INSTANTIATE_TEST_SUITE_P(Layers, KvWriteTest,
                         ::testing::Values(WriteCase{0, 5, ElemType::kF32, false},
                                           WriteCase{16, 5, ElemType::kF32, false},
                                           WriteCase{16, 5, ElemType::kF32, true},
                                           WriteCase{16, 1, ElemType::kBF16, true},
                                           WriteCase{0, 16, ElemType::kBF16, false},
                                           WriteCase{16, 16, ElemType::kF16, true},
                                           WriteCase{0, 1, ElemType::kF16, false}),
                         WriteName);

TEST(KvWrite, EmptyStepIsANoOp) {
  Shape shape;
  const Scenario sc(shape, {{4, 1}}, 30);
  auto d = sc.Upload();
  StepView st = d->step;
  st.num_tokens = 0;
  EXPECT_TRUE(CudaOk(cuda::LaunchKvCacheWrite(st, d->args, nullptr)));
  DcmhaLayerArgs bad = d->args;
  bad.cache.row_elems -= 1;
  EXPECT_EQ(cuda::LaunchKvCacheWrite(d->step, bad, nullptr), cudaErrorInvalidValue);
}

// The attention kernels read what the write kernel stored: the cached rows of each scenario
// come from LaunchKvCacheWrite of an earlier step.
TEST(KvWrite, AttentionReadsTheWrittenCache) {
  for (ElemType dtype : {ElemType::kF32, ElemType::kBF16}) {
    for (int window : {0, 16}) {
      SCOPED_TRACE(::testing::Message()
                   << "window " << window << " dtype " << static_cast<int>(dtype));
      Shape shape;
      shape.window = window;
      shape.block_size = 5;
      shape.cache_dtype = dtype;
      const Scenario sc(shape, {{30, 1}, {12, 7}, {0, 1}, {21, 1}}, 40 + window);
      auto d = sc.UploadFromHistory();
      ASSERT_TRUE(CudaOk(cuda::LaunchDcmha(d->step, d->args, nullptr)));
      ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
      const Error e = Compare(sc.Output(*d), sc.Reference());
      EXPECT_LE(e.max_abs, 2e-5);
      EXPECT_LE(e.nmse, 1e-10);
    }
  }
}

}  // namespace
}  // namespace dcf::cuda_test
