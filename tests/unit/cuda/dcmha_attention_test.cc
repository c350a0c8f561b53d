// LaunchDcmha against the CPU op (dcf::cpu::AttendOne) on random inputs: decode at several
// context lengths and block sizes, global and window layers, compose on and off, several
// sequences per step, prefill chunks (from 0, mid-sequence, longer than the window), mixed
// steps, the three cache dtypes and output dtypes, splits over long contexts and waves over
// a small workspace. Built twice (dcf_add_cuda_test): on the SIMT emulator (label unit) and
// for a real GPU (label gpu).
#include "engine/cuda/dcmha_attention.h"

#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/unit/cuda/dcmha_test_util.h"

namespace dcf::cuda_test {
namespace {

// Bounds: f32 everywhere differs from the CPU only by summation order (and FMA contraction
// on a GPU); a 16-bit output adds one rounding of the result (relative 2^-8 for bf16,
// 2^-11 for f16; outputs are O(1)).
struct Bounds {
  double max_abs;
  double nmse;
};
Bounds BoundsFor(ElemType out) {
  switch (out) {
    case ElemType::kBF16:
      return {3e-2, 3e-5};
    case ElemType::kF16:
      return {4e-3, 1e-6};
    default:
      return {2e-5, 1e-10};
  }
}

// Runs the scenario's step through LaunchDcmha and checks it against the CPU op.
void ExpectMatchesCpu(const Scenario& sc, size_t workspace_bytes = 0) {
  auto d = sc.Upload(workspace_bytes);
  ASSERT_TRUE(CudaOk(cuda::LaunchDcmha(d->step, d->args, nullptr)));
  ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
  const std::vector<float> got = sc.Output(*d);
  const std::vector<float> want = sc.Reference();
  const Error e = Compare(got, want);
  const Bounds b = BoundsFor(sc.shape().out_dtype);
  EXPECT_LE(e.max_abs, b.max_abs) << "nmse " << e.nmse;
  EXPECT_LE(e.nmse, b.nmse) << "max abs " << e.max_abs;
}

Shape MakeShape(int window, int block_size, bool compose, ElemType cache = ElemType::kF32,
                ElemType out = ElemType::kF32) {
  Shape s;
  s.window = window;
  s.block_size = block_size;
  s.compose = compose;
  s.cache_dtype = cache;
  s.out_dtype = out;
  return s;
}

// ---- Decode: one token per sequence -------------------------------------------------------

struct DecodeCase {
  int context;  // cached positions before the token
  int block_size;
  int window;
  bool compose;
};

std::string Describe(const DecodeCase& c) {
  return "ctx" + std::to_string(c.context) + "_B" + std::to_string(c.block_size) +
         (c.window > 0 ? "_W" + std::to_string(c.window) : std::string("_global")) +
         (c.compose ? "_dcmha" : "_mha");
}
void PrintTo(const DecodeCase& c, std::ostream* os) { *os << Describe(c); }
std::string DecodeName(const ::testing::TestParamInfo<DecodeCase>& info) {
  return Describe(info.param);
}

class DecodeTest : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(DecodeTest, MatchesCpu) {
  const DecodeCase& c = GetParam();
  const Scenario sc(MakeShape(c.window, c.block_size, c.compose), {{c.context, 1}},
                    1000 + c.context * 7 + c.block_size);
  ExpectMatchesCpu(sc);
}

INSTANTIATE_TEST_SUITE_P(
    Contexts, DecodeTest,
    ::testing::Values(
        // First token (no cached key), short, spanning many blocks, longer than the window.
        DecodeCase{0, 5, 0, true}, DecodeCase{6, 5, 0, true}, DecodeCase{6, 1, 0, true},
        DecodeCase{37, 16, 0, true}, DecodeCase{70, 5, 0, true}, DecodeCase{70, 1, 0, false},
        DecodeCase{70, 16, 0, false}, DecodeCase{0, 5, 16, true}, DecodeCase{9, 16, 16, true},
        DecodeCase{15, 5, 16, true}, DecodeCase{16, 5, 16, true}, DecodeCase{50, 5, 16, true},
        DecodeCase{50, 1, 16, true}, DecodeCase{50, 16, 16, false},
        // Long enough to be split over several thread blocks and reduced.
        DecodeCase{300, 16, 0, true}, DecodeCase{300, 5, 0, false}),
    DecodeName);

TEST(DcmhaDecode, SeveralSequencesOfDifferentLengths) {
  for (int window : {0, 16}) {
    SCOPED_TRACE(window);
    const Scenario sc(MakeShape(window, 5, true),
                      {{0, 1}, {33, 1}, {4, 1}, {70, 1}, {16, 1}, {15, 1}}, 7 + window);
    ExpectMatchesCpu(sc);
  }
}

// ---- Cache and output dtypes ------------------------------------------------------------

struct DtypeCase {
  ElemType cache;
  ElemType out;
};

void PrintTo(const DtypeCase& c, std::ostream* os) {
  *os << "cache " << static_cast<int>(c.cache) << " out " << static_cast<int>(c.out);
}

class DtypeTest : public ::testing::TestWithParam<DtypeCase> {};

TEST_P(DtypeTest, DecodeAndChunkMatchCpu) {
  const DtypeCase& c = GetParam();
  for (int window : {0, 16}) {
    SCOPED_TRACE(window);
    const Scenario sc(MakeShape(window, 16, true, c.cache, c.out), {{40, 1}, {20, 11}, {3, 1}},
                      99 + window);
    ExpectMatchesCpu(sc);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, DtypeTest,
                         ::testing::Values(DtypeCase{ElemType::kBF16, ElemType::kF32},
                                           DtypeCase{ElemType::kF16, ElemType::kF32},
                                           DtypeCase{ElemType::kBF16, ElemType::kBF16},
                                           DtypeCase{ElemType::kF32, ElemType::kF16}));

// ---- Prefill chunks ----------------------------------------------------------------------

TEST(DcmhaPrefill, ChunkFromTheStart) {
  for (bool compose : {true, false}) {
    SCOPED_TRACE(compose);
    ExpectMatchesCpu(Scenario(MakeShape(0, 5, compose), {{0, 21}}, 3));
  }
}

TEST(DcmhaPrefill, ChunkInTheMiddleOfASequence) {
  for (int block_size : {1, 5, 16}) {
    SCOPED_TRACE(block_size);
    ExpectMatchesCpu(Scenario(MakeShape(0, block_size, true), {{23, 13}}, 4 + block_size));
  }
}

TEST(DcmhaPrefill, WindowLayerChunks) {
  // Mid-sequence chunk that reaches back into cached window blocks; a chunk longer than the
  // window whose early positions are kept nowhere (their keys exist only as fresh inputs);
  // and the same from position 0.
  ExpectMatchesCpu(Scenario(MakeShape(16, 5, true), {{30, 9}}, 5));
  ExpectMatchesCpu(Scenario(MakeShape(16, 5, true), {{10, 37}}, 6));
  ExpectMatchesCpu(Scenario(MakeShape(16, 16, false), {{0, 40}}, 7));
}

TEST(DcmhaPrefill, MixedDecodeAndChunks) {
  for (int window : {0, 16}) {
    SCOPED_TRACE(window);
    ExpectMatchesCpu(Scenario(MakeShape(window, 5, true),
                              {{12, 1}, {0, 17}, {44, 1}, {25, 9}, {2, 2}, {60, 1}}, 8 + window));
  }
}

// ---- Workspace ---------------------------------------------------------------------------

TEST(DcmhaWorkspace, SmallWorkspaceRunsInWaves) {
  const Scenario sc(MakeShape(0, 5, true), {{5, 1}, {0, 19}, {30, 1}, {7, 6}}, 9);
  // Enough for a few tokens at a time only.
  const int N = sc.shape().n_head, hd = sc.shape().head_dim;
  const size_t few = cuda::DcmhaWorkspaceBytes(N, hd, 3, 3, 40);
  ASSERT_LT(few, cuda::DcmhaWorkspaceBytes(N, hd, sc.num_tokens(), 4, 40));
  ExpectMatchesCpu(sc, few);
}

TEST(DcmhaWorkspace, TooSmallIsAnError) {
  const Scenario sc(MakeShape(0, 5, true), {{30, 1}}, 10);
  auto d = sc.Upload(64);
  EXPECT_EQ(cuda::LaunchDcmha(d->step, d->args, nullptr), cudaErrorInvalidValue);
}

TEST(DcmhaWorkspace, GrowsWithTokensAndKeys) {
  const size_t base = cuda::DcmhaWorkspaceBytes(32, 80, 64, 64, 2048);
  EXPECT_GT(base, 64u * 2048 * 32 * 4);  // the composed scores of a decode step
  EXPECT_GE(cuda::DcmhaWorkspaceBytes(32, 80, 512, 64, 2048), base);
  EXPECT_GT(cuda::DcmhaWorkspaceBytes(32, 80, 64, 64, 4096), base);
}

// ---- Odd shapes and bad arguments ---------------------------------------------------------

TEST(DcmhaShapes, RowsThatForbidVectorLoads) {
  // N = 3, hd = 12: neither hd nor the row length is a multiple of 8 (scalar loads).
  Shape s = MakeShape(0, 5, true);
  s.n_head = 3;
  s.head_dim = 12;
  ExpectMatchesCpu(Scenario(s, {{20, 1}, {8, 10}}, 11));
  s.cache_dtype = ElemType::kBF16;
  ExpectMatchesCpu(Scenario(s, {{20, 1}, {8, 10}}, 12));
}

TEST(DcmhaShapes, ManyHeads) {
  // N = 40 > 32: lanes hold two heads in compose.
  Shape s = MakeShape(16, 5, true);
  s.n_head = 40;
  s.head_dim = 8;
  ExpectMatchesCpu(Scenario(s, {{25, 1}, {3, 9}}, 13));
}

TEST(DcmhaShapes, SupportedShapesAreKnownAtLoad) {
  EXPECT_TRUE(cuda::DcmhaShapeSupported(32, 80));    // DCFormer-2.8B
  EXPECT_TRUE(cuda::DcmhaShapeSupported(32, 128));   // DCPythia-6.9B
  EXPECT_TRUE(cuda::DcmhaShapeSupported(4, 16));     // the golden models
  EXPECT_FALSE(cuda::DcmhaShapeSupported(64, 128));  // N * hd = 8192 > 4096
  EXPECT_FALSE(cuda::DcmhaShapeSupported(300, 8));   // N > 256
  EXPECT_FALSE(cuda::DcmhaShapeSupported(16, 36));   // no vector loads: N * hd > 512
  EXPECT_FALSE(cuda::DcmhaShapeSupported(0, 16));
}

TEST(DcmhaShapes, DcFormer28BShape) {
  // N = 32, hd = 80 (320 threads per block, one warp per pair in compose), bf16 cache and
  // output as on the GPU; a decode token and a chunk, global and window layers.
  for (int window : {0, 16}) {
    SCOPED_TRACE(window);
    Shape s = MakeShape(window, 16, true, ElemType::kBF16, ElemType::kBF16);
    s.n_head = 32;
    s.head_dim = 80;
    ExpectMatchesCpu(Scenario(s, {{35, 1}, {6, 12}}, 15 + window));
  }
}

TEST(DcmhaShapes, BadArgumentsAreRejected) {
  const Scenario sc(MakeShape(0, 5, true), {{4, 1}}, 14);
  auto d = sc.Upload();
  DcmhaLayerArgs a = d->args;
  a.cache.row_elems += 1;
  EXPECT_EQ(cuda::LaunchDcmha(d->step, a, nullptr), cudaErrorInvalidValue);
  a = d->args;
  a.layer_in_group = Scenario::kLayersInGroup;
  EXPECT_EQ(cuda::LaunchDcmha(d->step, a, nullptr), cudaErrorInvalidValue);
  a = d->args;
  a.n_head = 300;
  EXPECT_EQ(cuda::LaunchDcmha(d->step, a, nullptr), cudaErrorInvalidValue);
  a = d->args;
  a.workspace = nullptr;
  EXPECT_EQ(cuda::LaunchDcmha(d->step, a, nullptr), cudaErrorInvalidValue);
}

// ---- Decode kernels (dcmha_decode.cu) against the kernels they replace --------------------

// Output of one LaunchDcmha of the scenario, with the decode kernels or without.
std::vector<float> RunDecode(const Scenario& sc, bool split_decode) {
  auto d = sc.Upload();
  d->args.split_decode = split_decode;
  EXPECT_TRUE(CudaOk(cuda::LaunchDcmha(d->step, d->args, nullptr)));
  EXPECT_TRUE(CudaOk(cudaDeviceSynchronize()));
  return sc.Output(*d);
}

TEST(DcmhaSplitDecode, MatchesThePrefillKernelsItReplaces) {
  // Many splits (long contexts, also cut mid-block), one split (short), the first token, and
  // a window; the same math in another order: equal to f32 rounding.
  const std::vector<SeqSpec> seqs = {{700, 1}, {0, 1}, {3, 1}, {301, 1}, {64, 1}, {129, 1}};
  for (int window : {0, 48}) {
    for (bool compose : {true, false}) {
      SCOPED_TRACE(testing::Message() << "window " << window << " compose " << compose);
      const Scenario sc(MakeShape(window, 16, compose), seqs, 31 + window + compose);
      const Error e = Compare(RunDecode(sc, true), RunDecode(sc, false));
      EXPECT_LE(e.max_abs, 2e-6) << "nmse " << e.nmse;
      const Error ref = Compare(RunDecode(sc, true), sc.Reference());
      EXPECT_LE(ref.max_abs, 2e-5) << "nmse " << ref.nmse;
    }
  }
}

TEST(DcmhaSplitDecode, RepeatedLaunchesAreBitIdentical) {
  // The splits' statistics and partial rows are merged by whichever block finishes last, in a
  // fixed order, and the counters are back at zero after each launch.
  const Scenario sc(MakeShape(0, 5, true, ElemType::kBF16, ElemType::kF32),
                    {{500, 1}, {90, 1}, {7, 1}}, 41);
  auto d = sc.Upload();
  std::vector<float> first;
  for (int run = 0; run < 3; ++run) {
    ASSERT_TRUE(CudaOk(cuda::LaunchDcmha(d->step, d->args, nullptr)));
    ASSERT_TRUE(CudaOk(cudaDeviceSynchronize()));
    const std::vector<float> got = sc.Output(*d);
    if (run == 0) {
      first = got;
    } else {
      ASSERT_EQ(got.size(), first.size());
      EXPECT_EQ(0, std::memcmp(got.data(), first.data(), got.size() * sizeof(float)))
          << "run " << run;
    }
  }
}

TEST(DcmhaSplitDecode, GridsFillTheDeviceAtBatchOne) {
  // DCFormer-2.8B (N 32, hd 80, bf16 cache): at batch 1, >= 2 waves of 132 SMs on a global
  // layer with 2048 cached keys (plus the new one) and >= 1 wave on a 256-key window layer,
  // in both passes; batch 64 too. The emulator reports 132 SMs, as an H200 has.
  cudaDeviceProp prop{};
  ASSERT_TRUE(CudaOk(cudaGetDeviceProperties(&prop, 0)));
  const int sms = prop.multiProcessorCount;
  const cuda::DcmhaDecodeGrids global = cuda::DescribeDcmhaDecode(32, 80, ElemType::kBF16, 1, 2049);
  EXPECT_GE(global.scores_busy, 2 * sms);
  EXPECT_GE(global.output_busy, 2 * sms);
  EXPECT_GE(global.scores_blocks, global.scores_busy);
  EXPECT_GE(global.output_blocks, global.output_busy);
  const cuda::DcmhaDecodeGrids window = cuda::DescribeDcmhaDecode(32, 80, ElemType::kBF16, 1, 256);
  EXPECT_GE(window.scores_busy, sms);
  EXPECT_GE(window.output_busy, sms);
  const cuda::DcmhaDecodeGrids b64 = cuda::DescribeDcmhaDecode(32, 80, ElemType::kBF16, 64, 2049);
  EXPECT_GE(b64.scores_busy, 2 * sms);
  EXPECT_GE(b64.output_busy, 2 * sms);
  if (sms == 132) {
    EXPECT_GE(global.scores_busy, 264);
    EXPECT_GE(window.scores_busy, 132);
  }
}

TEST(DcmhaSplitDecode, DcFormer28BShapeAtLongContexts) {
  // The shape the grids above are for, bf16 cache and output: a 2047-key global layer (one
  // fresh key on top) and a 256-key window layer, as one decode step each.
  for (int window : {0, 256}) {
    SCOPED_TRACE(window);
    Shape s = MakeShape(window, 16, true, ElemType::kBF16, ElemType::kBF16);
    s.n_head = 32;
    s.head_dim = 80;
    const Scenario sc(s, {{window > 0 ? 600 : 2047, 1}}, 51 + window);
    ExpectMatchesCpu(sc);
    const Error e = Compare(RunDecode(sc, true), RunDecode(sc, false));
    EXPECT_LE(e.max_abs, 1.6e-2) << "nmse " << e.nmse;  // one bf16 rounding of the output
  }
}

}  // namespace
}  // namespace dcf::cuda_test
