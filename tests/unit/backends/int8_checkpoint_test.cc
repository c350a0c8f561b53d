// int8 checkpoints written by dcformer-quantize (docs/QUANTIZATION.md): one loads into the
// same matrices, hence the same logits bit for bit, as --weight-dtype int8 applied to the
// checkpoint it was made from; the cuda backends refuse it; malformed or mismatched scale
// tensors are refused at load, naming the tensor.
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/backends/backend_factory.h"
#include "engine/serving/sequence_runner.h"
#include "engine/weights/checkpoint.h"
#include "engine/weights/safetensors_writer.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_dir.h"

namespace dcf {
namespace {

const std::string kModelDir = std::string(DCF_SOURCE_DIR) + "/models/dcformer-kjv";
const std::string kQuantize = std::string(DCF_BIN_DIR) + "/dcformer-quantize";

// Teacher-forced logits of a fixed token sequence, [T, V].
std::vector<float> Logits(Backend* backend) {
  auto runner = SequenceRunner::Create(backend);
  EXPECT_TRUE(runner.ok()) << runner.status();
  std::vector<int32_t> tokens;
  for (int i = 0; i < 40; ++i) tokens.push_back((i * 977 + 13) % backend->config().vocab_size);
  std::vector<float> logits;
  EXPECT_TRUE((*runner)->Append(tokens, 7, &logits).ok());
  return logits;
}

// Both backends' Logits, bit for bit; a's in `logits`.
void ExpectSameLogits(Backend* a, Backend* b, std::vector<float>* logits) {
  *logits = Logits(a);
  const std::vector<float> other = Logits(b);
  ASSERT_EQ(logits->size(), other.size());
  ASSERT_FALSE(logits->empty());
  EXPECT_EQ(0, std::memcmp(logits->data(), other.data(), other.size() * sizeof(float)));
}

// Every tensor of a checkpoint file, as stored.
struct StoredFile {
  std::vector<StoredTensor> tensors;
  std::vector<std::vector<uint8_t>> bytes;
};
StoredFile ReadAll(const std::string& dir) {
  StoredFile f;
  auto reader = OpenCheckpointDir(dir);
  EXPECT_TRUE(reader.ok()) << reader.status();
  for (const TensorInfo& t : (*reader)->tensors()) {
    auto& b = f.bytes.emplace_back(static_cast<size_t>(t.NumElements()) * DTypeSize(t.dtype));
    EXPECT_TRUE((*reader)->Read(t.name, t.dtype, b.data(), t.NumElements()).ok());
  }
  for (size_t i = 0; i < (*reader)->tensors().size(); ++i) {
    const TensorInfo& t = (*reader)->tensors()[i];
    f.tensors.push_back({t.name, t.dtype, t.shape, f.bytes[i].data()});
  }
  return f;
}

class Int8CheckpointTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    const auto r = testing::RunCommand(kQuantize + " --model " + kModelDir + " --out " +
                                       dir_->path() + " --group-size 64");
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  static void TearDownTestSuite() { delete dir_; }

  // LoadModel's error after `edit` changed the quantized checkpoint's tensors (a copy).
  static std::string LoadError(const std::function<void(StoredFile&)>& edit) {
    testing::TempDir bad;
    bad.Write("config.json", dir_->Read("config.json"));
    StoredFile f = ReadAll(dir_->path());
    edit(f);
    EXPECT_TRUE(WriteSafetensors(bad.File("model.safetensors"), f.tensors).ok());
    BackendOptions options;
    options.kind = BackendKind::kCpu;
    auto m = LoadModel(bad.path(), options);
    EXPECT_FALSE(m.ok()) << "a malformed int8 checkpoint loaded";
    return m.ok() ? "" : std::string(m.status().message());
  }
  static StoredTensor* Find(StoredFile& f, const std::string& name) {
    for (StoredTensor& t : f.tensors) {
      if (t.name == name) return &t;
    }
    ADD_FAILURE() << "no tensor " << name;
    static StoredTensor none;
    return &none;
  }

  static testing::TempDir* dir_;
};

testing::TempDir* Int8CheckpointTest::dir_ = nullptr;

TEST_F(Int8CheckpointTest, LoadsToTheSameLogitsAsQuantizingAtLoad) {
  BackendOptions options;
  options.kind = BackendKind::kCpu;
  auto offline = LoadModel(dir_->path(), options);
  ASSERT_TRUE(offline.ok()) << offline.status();
  EXPECT_EQ(offline->config.int8_group_size, 64);
  EXPECT_EQ(offline->backend->info().int8_weight_group, 64);
  options.weight_quant = WeightQuant::kInt8;
  options.weight_group_size = 64;
  auto at_load = LoadModel(kModelDir, options);
  ASSERT_TRUE(at_load.ok()) << at_load.status();
  std::vector<float> a;
  ASSERT_NO_FATAL_FAILURE(ExpectSameLogits(offline->backend.get(), at_load->backend.get(), &a));
  // And quantization did something: the bf16 model's logits differ.
  options.weight_quant = WeightQuant::kNone;
  auto plain = LoadModel(kModelDir, options);
  ASSERT_TRUE(plain.ok());
  const std::vector<float> c = Logits(plain->backend.get());
  EXPECT_NE(0, std::memcmp(a.data(), c.data(), a.size() * sizeof(float)));
  // A different group size than the checkpoint's is refused.
  options.weight_quant = WeightQuant::kInt8;
  options.weight_group_size = 32;
  auto mismatch = LoadModel(dir_->path(), options);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.status().message().find("groups of 64"), std::string::npos)
      << mismatch.status();
}

// --activation-dtype int8 on an offline int8 checkpoint gives the bits of quantizing at load
// with it, differs from weight-only, and is refused without int8 matrices or off the cpu.
TEST_F(Int8CheckpointTest, Int8ActivationsLoadFromEitherAndNeedInt8Matrices) {
  BackendOptions options;
  options.kind = BackendKind::kCpu;
  options.activation_quant = ActivationQuant::kInt8;
  auto offline = LoadModel(dir_->path(), options);
  ASSERT_TRUE(offline.ok()) << offline.status();
  EXPECT_TRUE(offline->backend->info().int8_activations);
  EXPECT_EQ(WeightsName(offline->backend->info()), "int8 x int8 (group 64)");
  options.weight_quant = WeightQuant::kInt8;
  options.weight_group_size = 64;
  auto at_load = LoadModel(kModelDir, options);
  ASSERT_TRUE(at_load.ok()) << at_load.status();
  std::vector<float> a;
  ASSERT_NO_FATAL_FAILURE(ExpectSameLogits(offline->backend.get(), at_load->backend.get(), &a));
  options.activation_quant = ActivationQuant::kFloat32;
  auto weight_only = LoadModel(kModelDir, options);
  ASSERT_TRUE(weight_only.ok());
  const std::vector<float> c = Logits(weight_only->backend.get());
  EXPECT_NE(0, std::memcmp(a.data(), c.data(), a.size() * sizeof(float)));
  // Without int8 matrices.
  options.weight_quant = WeightQuant::kNone;
  options.activation_quant = ActivationQuant::kInt8;
  auto plain = LoadModel(kModelDir, options);
  ASSERT_FALSE(plain.ok());
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plain.status().message().find("give --weight-dtype int8"), std::string::npos)
      << plain.status();
  // On the emulated CUDA backend.
  options.kind = BackendKind::kCudaSim;
  auto sim = LoadModel(kModelDir, options);
  ASSERT_FALSE(sim.ok());
  EXPECT_NE(sim.status().message().find("no int8 x int8 kernels"), std::string::npos)
      << sim.status();
  // Refused before anything is read: a directory without config.json names the flag too.
  auto unread = LoadModel(::testing::TempDir() + "/no-such-model", options);
  ASSERT_FALSE(unread.ok());
  EXPECT_NE(unread.status().message().find("no int8 x int8 kernels"), std::string::npos)
      << unread.status();
}

// The cuda backends scale per output channel: they refuse a checkpoint of per-group scales,
// naming both layouts and the way in (--weight-dtype int8 on the float checkpoint), which
// loads.
TEST_F(Int8CheckpointTest, CudaBackendsRefuseGroupScalesAndQuantizeAtLoad) {
  BackendOptions options;
  options.kind = BackendKind::kCudaSim;
  auto m = LoadModel(dir_->path(), options);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("one scale per 64 columns"), std::string::npos)
      << m.status();
  EXPECT_NE(m.status().message().find("one scale per output channel"), std::string::npos)
      << m.status();
  EXPECT_NE(m.status().message().find("--weight-dtype int8"), std::string::npos) << m.status();
  options.weight_quant = WeightQuant::kInt8;
  auto q = LoadModel(kModelDir, options);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->backend->info().channel_quant, WeightQuant::kInt8);
  EXPECT_EQ(WeightsName(q->backend->info()), "int8 (per channel)");
}

TEST_F(Int8CheckpointTest, RefusesMalformedScalesNamingTheTensor) {
  const std::string scale = "layers.1.attention.wo.weight_scale";
  const std::string matrix = "layers.1.attention.wo.weight";
  // Missing.
  EXPECT_NE(LoadError([&](StoredFile& f) {
              std::erase_if(f.tensors, [&](const StoredTensor& t) { return t.name == scale; });
            }).find("'" + scale + "' is missing"),
            std::string::npos);
  // Wrong dtype.
  EXPECT_NE(LoadError([&](StoredFile& f) { Find(f, scale)->dtype = DType::kF16; })
                .find("'" + scale + "' is F16, expected BF16"),
            std::string::npos);
  // Wrong shape (the groups of another group size).
  std::vector<uint16_t> wide;
  EXPECT_NE(LoadError([&](StoredFile& f) {
              StoredTensor* t = Find(f, scale);
              wide.assign(static_cast<size_t>(t->shape[0] * t->shape[1] * 2), 0x3c00);
              t->shape[1] *= 2;
              t->data = wide.data();
            }).find("'" + scale + "' has shape"),
            std::string::npos);
  // A negative and a NaN scale.
  for (const uint16_t bits : {uint16_t{0xbf80}, uint16_t{0x7fc0}}) {
    std::vector<uint16_t> copy;
    EXPECT_NE(LoadError([&](StoredFile& f) {
                StoredTensor* t = Find(f, scale);
                const auto* s = static_cast<const uint16_t*>(t->data);
                copy.assign(s, s + t->shape[0] * t->shape[1]);
                copy[5] = bits;
                t->data = copy.data();
              }).find("'" + scale + "': scale 5"),
              std::string::npos);
  }
  // A finite scale so large that 127 * scale overflows (0x7f7f: 3.39e38).
  {
    std::vector<uint16_t> copy;
    EXPECT_NE(LoadError([&](StoredFile& f) {
                StoredTensor* t = Find(f, scale);
                const auto* s = static_cast<const uint16_t*>(t->data);
                copy.assign(s, s + t->shape[0] * t->shape[1]);
                copy[7] = 0x7f7f;
                t->data = copy.data();
              }).find("'" + scale + "': scale 7 is 3.38953e+38, so 127 * scale overflows"),
              std::string::npos);
  }
  // A code of -128 (QUANTIZATION.md: q in [-127, 127]).
  {
    std::vector<int8_t> codes;
    EXPECT_NE(LoadError([&](StoredFile& f) {
                StoredTensor* t = Find(f, matrix);
                const auto* q = static_cast<const int8_t*>(t->data);
                codes.assign(q, q + t->shape[0] * t->shape[1]);
                codes[1234] = -128;
                t->data = codes.data();
              }).find("'" + matrix + "': value 1234 is -128"),
              std::string::npos);
  }
  // The matrix stored as float beside its scales.
  std::vector<uint16_t> f16;
  EXPECT_NE(LoadError([&](StoredFile& f) {
              StoredTensor* t = Find(f, matrix);
              f16.assign(static_cast<size_t>(t->shape[0] * t->shape[1]), 0);
              t->dtype = DType::kF16;
              t->data = f16.data();
            }).find("'" + matrix + "' is F16, expected I8"),
            std::string::npos);
  // A scale for a tensor that is not quantized.
  std::vector<uint16_t> extra(192, 0x3f80);
  EXPECT_NE(LoadError([&](StoredFile& f) {
              f.tensors.push_back({"norm.weight_scale", DType::kBF16, {192, 1}, extra.data()});
            }).find("unexpected tensor 'norm.weight_scale'"),
            std::string::npos);
}

// An I8 tensor in a checkpoint whose config.json has no quantization_config is refused.
TEST_F(Int8CheckpointTest, RefusesInt8TensorsWithoutQuantizationConfig) {
  testing::TempDir bad;
  std::ifstream in(kModelDir + "/config.json");
  const std::string config(std::istreambuf_iterator<char>(in), {});
  bad.Write("config.json", config);
  StoredFile f = ReadAll(dir_->path());
  std::erase_if(f.tensors, [](const StoredTensor& t) { return t.name.ends_with("_scale"); });
  ASSERT_TRUE(WriteSafetensors(bad.File("model.safetensors"), f.tensors).ok());
  BackendOptions options;
  options.kind = BackendKind::kCpu;
  auto m = LoadModel(bad.path(), options);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("is I8, which needs config.json's quantization_config"),
            std::string::npos)
      << m.status();
}

}  // namespace
}  // namespace dcf
