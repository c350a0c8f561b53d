// Models loaded end to end through the backend factory: alternative layouts and dtypes give
// the same logits, and a config that does not fit the files is refused naming the tensor.
#include <algorithm>
#include <cmath>
#include <fstream>

#include "engine/backends/backend_factory.h"
#include "engine/common/memory_info.h"
#include "engine/cuda/cuda_backend_factory.h"
#include "engine/serving/sequence_runner.h"
#include "engine/simt/simt_testing.h"
#include "gtest/gtest.h"
#include "tests/testing/model_files.h"
#include "tests/testing/peak_memory.h"
#include "tests/testing/temp_dir.h"

namespace dcf {
namespace {

class ModelLoaderTest : public testing::ModelFilesTest {
 protected:
  // Logits of a fixed sequence; empty (and a test failure) when the model does not load.
  std::vector<float> Logits() {
    auto m = LoadModel(dir_.path());
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return {};
    auto r = SequenceRunner::Create(m->backend.get());
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    std::vector<float> logits;
    const std::vector<int32_t> tokens = {1, 5, 9, 2, 33, 63, 0, 7, 7, 12};
    EXPECT_TRUE((*r)->Append(tokens, 4, &logits).ok());
    return logits;
  }
};

TEST_F(ModelLoaderTest, SplitQkvEqualsFused) {
  const std::vector<float> reference = Logits();
  ASSERT_EQ(reference.size(), 10u * 64);
  SplitQkv();
  Rewrite();
  EXPECT_EQ(Logits(), reference);
}

TEST_F(ModelLoaderTest, Bf16AndF16FilesLoad) {
  const std::vector<float> reference = Logits();
  ASSERT_EQ(reference.size(), 10u * 64);
  for (DType dt : {DType::kBF16, DType::kF16}) {
    Rewrite(dt);
    const std::vector<float> got = Logits();
    ASSERT_EQ(got.size(), reference.size());
    double max_diff = 0;
    for (size_t i = 0; i < got.size(); ++i) max_diff = std::max<double>(max_diff, std::abs(got[i] - reference[i]));
    EXPECT_GT(max_diff, 0.0);   // the weights were really rounded
    EXPECT_LT(max_diff, 0.5);   // ... but still the same model
  }
}

TEST_F(ModelLoaderTest, WrongConfigForFileNamesTheTensor) {
  config_json_["intermediate_size"] = 50;
  std::ofstream(dir_.File("config.json")) << config_json_.dump();
  auto m = LoadModel(dir_.path());
  ASSERT_FALSE(m.ok());
  EXPECT_NE(std::string(m.status().message()).find("feed_forward.w1.weight"), std::string::npos)
      << m.status();
}

TEST_F(ModelLoaderTest, ReportsMissingPieces) {
  testing::TempDir dir;
  EXPECT_EQ(LoadModel(dir.path()).status().code(), absl::StatusCode::kNotFound);  // no config
  std::ofstream(dir.File("config.json")) << SmallDcFormerConfig(32, 2, 4, 48, 64, 64, 8).dump();
  auto m = LoadModel(dir.path());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);  // no weights
}

// --check-weights with --dtype float16 on an F32 checkpoint holding 1e5 (beyond F16's 65504):
// both backends name the conversion (cpu converts while loading, cuda-sim while uploading,
// where nothing scanned it before); without the flag the model loads.
TEST_F(ModelLoaderTest, CheckWeightsNamesAConversionOutOfRange) {
  data_[Index("layers.0.feed_forward.w2.weight")][3] = 1e5f;
  Rewrite();
  for (BackendKind kind : {BackendKind::kCpu, BackendKind::kCudaSim}) {
    BackendOptions o;
    o.kind = kind;
    o.dtype = DType::kF16;
    EXPECT_TRUE(LoadModel(dir_.path(), o).ok()) << BackendKindName(kind);
    o.check_weights = true;
    auto m = LoadModel(dir_.path(), o);
    ASSERT_FALSE(m.ok()) << BackendKindName(kind);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(m.status().message()).find("holds 1 values beyond the range of F16"),
              std::string::npos)
        << m.status();
    EXPECT_NE(std::string(m.status().message()).find("feed_forward.w2"), std::string::npos)
        << m.status();
    o.dtype = DType::kBF16;
    EXPECT_TRUE(LoadModel(dir_.path(), o).ok()) << BackendKindName(kind);
  }
}

// A config.json naming an absurd context (block_size 10^8 took 59 s and 12.5 GB on cuda-sim
// before the RoPE tables' device allocation failed; 2^30, an uncaught std::bad_alloc) is
// refused naming block_size, on every backend, before anything is allocated for it.
TEST_F(ModelLoaderTest, AbsurdContextIsRefusedNamingBlockSize) {
  for (int64_t block_size : {int64_t{100000000}, int64_t{1} << 30}) {
    config_json_["block_size"] = block_size;
    std::ofstream(dir_.File("config.json")) << config_json_.dump();
    for (BackendKind kind : {BackendKind::kCpu, BackendKind::kCudaSim}) {
      BackendOptions o;
      o.kind = kind;
      auto m = LoadModel(dir_.path(), o);
      ASSERT_FALSE(m.ok()) << BackendKindName(kind);
      EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(std::string(m.status().message()).find("'block_size' is " +
                                                       std::to_string(block_size)),
                std::string::npos)
          << m.status();
    }
  }
}

// The CUDA backend on cuda-sim bounds the context itself (a ModelConfig built in code skips
// config.json's check): 2^30 positions are refused before anything is allocated, and at the
// longest context served the RoPE tables go to the device first, so a device without room
// for them fails ResourceExhausted naming them before the host built 2 x 16 MB of angles.
TEST_F(ModelLoaderTest, CudaSimBoundsTheContextBeforeAllocatingTheRopeTables) {
  const auto create = [&](int max_positions) {
    ModelConfig c = config_;
    c.max_positions = max_positions;
    auto reader = OpenCheckpointDir(dir_.path());
    EXPECT_TRUE(reader.ok()) << reader.status();
    auto weights = LoadModelWeights(c, **reader);
    EXPECT_TRUE(weights.ok()) << weights.status();
    BackendOptions o;
    o.dtype = DType::kF32;
    const bool reset = testing::ResetPeakResident();
    const size_t before = ProcessResidentBytes(), device_before = simt::DeviceMemoryUsedBytes();
    auto b = cuda::sim::CreateBackend(c, *std::move(weights), o);
    // The emulator's device memory is host memory: beyond it, the host never holds
    // per-position tables.
    const size_t device = simt::DeviceMemoryUsedBytes() - device_before;
    if (reset) {
      EXPECT_LT(testing::PeakResidentBytes(), before + device + (12u << 20)) << max_positions;
    }
    return b.status();
  };
  absl::Status st = create(1 << 30);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(std::string(st.message()).find("contexts of 1 to 1048576 positions (model: "
                                           "1073741824)"),
            std::string::npos)
      << st;

  // Room for the weights (under 1 MB; the emulator's GEMM has no workspace), not for a
  // 16 MB RoPE table (2^20 positions x rotary_dim/2 = 4 floats).
  ASSERT_EQ(config_.rotary_dim, 8);
  const size_t device = simt::DeviceMemoryBytes();
  simt::SetDeviceMemoryBytes(simt::DeviceMemoryUsedBytes() + (8u << 20));
  st = create(ModelConfig::kMaxPositions);
  simt::SetDeviceMemoryBytes(device);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_NE(std::string(st.message()).find("RoPE table"), std::string::npos) << st;

  // With the room, the longest context is served, and its tables hold every position.
  EXPECT_TRUE(create(ModelConfig::kMaxPositions).ok());
}

}  // namespace
}  // namespace dcf
