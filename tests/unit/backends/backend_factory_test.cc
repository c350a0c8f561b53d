// Backend and dtype names, and what LoadModel does with each choice on this build.
#include "engine/backends/backend_factory.h"

#include "engine/cuda/cuda_backend_factory.h"
#include "engine/model/model_weights.h"
#include "engine/weights/checkpoint.h"
#include "gtest/gtest.h"
#include "tests/testing/golden.h"

namespace dcf {
namespace {

TEST(BackendFactoryTest, ParsesNamesAndRefusesOthers) {
  for (BackendKind k : {BackendKind::kAuto, BackendKind::kCpu, BackendKind::kCuda,
                        BackendKind::kCudaSim}) {
    auto parsed = ParseBackendKind(BackendKindName(k));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, k);
  }
  const absl::Status bad = ParseBackendKind("tpu").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("cuda-sim"), std::string::npos) << bad.message();
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    auto parsed = ParseComputeDType(ComputeDTypeName(d));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(*ParseComputeDType("bf16"), DType::kBF16);
  EXPECT_EQ(ParseComputeDType("int8").status().code(), absl::StatusCode::kInvalidArgument);
  for (WeightQuant w : {WeightQuant::kNone, WeightQuant::kInt8, WeightQuant::kFp8}) {
    auto parsed = ParseWeightQuant(WeightQuantName(w));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, w);
  }
  for (ActivationQuant a : {ActivationQuant::kFloat32, ActivationQuant::kInt8,
                            ActivationQuant::kFp8}) {
    auto parsed = ParseActivationQuant(ActivationQuantName(a));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, a);
  }
  EXPECT_EQ(*ParseActivationQuant("FP32"), ActivationQuant::kFloat32);
  const absl::Status act = ParseActivationQuant("int4").status();
  EXPECT_EQ(act.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(act.message().find("float32, int8 or fp8"), std::string::npos) << act.message();
}

// Which backend runs which weight and activation dtypes (docs/QUANTIZATION.md): each refusal
// names the flag and where it runs; LoadModel refuses before reading a file.
TEST(BackendFactoryTest, RefusesQuantizationsABackendHasNoKernelsFor) {
  struct Case {
    BackendKind kind;
    WeightQuant weights;
    ActivationQuant activations;
    const char* error;  // nullptr: accepted
  };
  const Case cases[] = {
      {BackendKind::kCpu, WeightQuant::kInt8, ActivationQuant::kFloat32, nullptr},
      {BackendKind::kCpu, WeightQuant::kInt8, ActivationQuant::kInt8, nullptr},
      {BackendKind::kCpu, WeightQuant::kFp8, ActivationQuant::kFloat32,
       "--weight-dtype fp8: the cpu backend has no fp8 kernels"},
      {BackendKind::kCpu, WeightQuant::kNone, ActivationQuant::kFp8,
       "--activation-dtype fp8: the cpu backend has no fp8 kernels"},
      {BackendKind::kCudaSim, WeightQuant::kInt8, ActivationQuant::kFloat32, nullptr},
      {BackendKind::kCudaSim, WeightQuant::kFp8, ActivationQuant::kFloat32, nullptr},
      {BackendKind::kCudaSim, WeightQuant::kFp8, ActivationQuant::kFp8, nullptr},
      {BackendKind::kCuda, WeightQuant::kFp8, ActivationQuant::kFp8, nullptr},
      {BackendKind::kCudaSim, WeightQuant::kInt8, ActivationQuant::kFp8,
       "--activation-dtype fp8 multiplies fp8 weights"},
      {BackendKind::kCudaSim, WeightQuant::kNone, ActivationQuant::kFp8,
       "--activation-dtype fp8 multiplies fp8 weights"},
      {BackendKind::kCudaSim, WeightQuant::kInt8, ActivationQuant::kInt8,
       "no int8 x int8 kernels"},
      {BackendKind::kCuda, WeightQuant::kFp8, ActivationQuant::kInt8, "no int8 x int8 kernels"},
  };
  for (const Case& c : cases) {
    BackendOptions o;
    o.kind = c.kind;
    o.weight_quant = c.weights;
    o.activation_quant = c.activations;
    const std::string what = std::string(BackendKindName(c.kind)) + " " +
                             WeightQuantName(c.weights) + " x " +
                             ActivationQuantName(c.activations);
    const absl::Status st = CheckQuantization(c.kind, o);
    if (c.error == nullptr) {
      EXPECT_TRUE(st.ok()) << what << ": " << st;
      continue;
    }
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << what;
    EXPECT_NE(st.message().find(c.error), std::string::npos) << what << ": " << st.message();
    if (c.kind != BackendKind::kCuda) {  // LoadModel: refused before reading anything
      const absl::Status loaded =
          LoadModel(::testing::TempDir() + "/no-such-model", o).status();
      EXPECT_NE(loaded.message().find(c.error), std::string::npos) << what << ": " << loaded;
    }
  }
}

// The cuda-sim backend built directly (no factory in front of it) refuses the same weight and
// activation dtypes with the same status: CheckQuantization is the one rule for both.
TEST(BackendFactoryTest, CudaSimCreatedDirectlyRefusesWhatTheFactoryRefuses) {
  if (!CudaSimBackendBuilt()) GTEST_SKIP() << "this build has no cuda-sim backend";
  const std::string dir = testing::GoldenDir("dcformer-f32-long-prompt");
  absl::StatusOr<ModelConfig> config = ModelConfig::FromFile(dir + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  int refused = 0;
  for (WeightQuant w : {WeightQuant::kNone, WeightQuant::kInt8, WeightQuant::kFp8}) {
    for (ActivationQuant a :
         {ActivationQuant::kFloat32, ActivationQuant::kInt8, ActivationQuant::kFp8}) {
      BackendOptions o;
      o.kind = BackendKind::kCudaSim;
      o.dtype = DType::kF32;
      o.weight_quant = w;
      o.activation_quant = a;
      const absl::Status want = CheckQuantization(BackendKind::kCudaSim, o);
      if (want.ok()) continue;  // building those is the conformance tests' job
      ++refused;
      absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = OpenCheckpointDir(dir);
      ASSERT_TRUE(reader.ok()) << reader.status();
      absl::StatusOr<ModelWeights> weights = LoadModelWeights(*config, **reader);
      ASSERT_TRUE(weights.ok()) << weights.status();
      const absl::Status got =
          cuda::sim::CreateBackend(*config, *std::move(weights), o).status();
      EXPECT_EQ(got, want) << WeightQuantName(w) << " x " << ActivationQuantName(a);
    }
  }
  // int8 activations with any weights, fp8 activations with none or int8 weights.
  EXPECT_EQ(refused, 5);
}

TEST(BackendFactoryTest, AutoIsCpuWithoutADevice) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is visible";
  EXPECT_EQ(ResolveBackendKind(BackendKind::kAuto), BackendKind::kCpu);
  ::testing::internal::CaptureStderr();
  auto m = LoadModel(testing::GoldenDir("dcformer-f32-short-prompt"));
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(m.ok()) << m.status();
  // The choice and its reason are logged at INFO or, when a CUDA build falls back, WARN.
  const AutoBackendChoice choice = ChooseAutoBackend();
  EXPECT_EQ(choice.fallback, CudaBackendBuilt());
  EXPECT_NE(log.find(choice.fallback ? " WARN " : " INFO "), std::string::npos) << log;
  EXPECT_NE(log.find("--backend auto: "), std::string::npos) << log;
  EXPECT_NE(log.find(choice.reason), std::string::npos) << log;
  const BackendInfo info = m->backend->info();
  EXPECT_EQ(info.name, "cpu");
  EXPECT_EQ(info.dtype, DType::kF32);
  EXPECT_FALSE(info.device.empty());
}

// What auto chooses, and the reason it logs, for each situation a GPU pod can be in.
TEST(BackendFactoryTest, AutoSaysWhatItChoseAndWhy) {
  AutoBackendChoice c = ChooseAutoBackend(false, absl::OkStatus(), 0);
  EXPECT_EQ(c.kind, BackendKind::kCpu);
  EXPECT_FALSE(c.fallback);
  EXPECT_NE(c.reason.find("no CUDA backend"), std::string::npos) << c.reason;

  // The plugin did not load (here: a library it needs is missing): every dlerror, one line.
  c = ChooseAutoBackend(
      true,
      absl::UnavailableError("cannot load the CUDA backend (libdcformer_cuda_plugin.so); tried:"
                             "\n  /opt/dcformer/lib/libdcformer_cuda_plugin.so: libcublas.so.13:"
                             " cannot open shared object file\n  libdcformer_cuda_plugin.so: "
                             "cannot open shared object file"),
      0);
  EXPECT_EQ(c.kind, BackendKind::kCpu);
  EXPECT_TRUE(c.fallback);
  EXPECT_NE(c.reason.find("plugin did not load"), std::string::npos) << c.reason;
  EXPECT_NE(c.reason.find("libcublas.so.13: cannot open shared object file"), std::string::npos)
      << c.reason;
  EXPECT_EQ(c.reason.find('\n'), std::string::npos) << c.reason;

  // It loaded, but no device is usable: the reason is the CUDA error, with what it means.
  c = ChooseAutoBackend(true, absl::OkStatus(), 0);
  EXPECT_EQ(c.kind, BackendKind::kCpu);
  EXPECT_TRUE(c.fallback);
  EXPECT_NE(c.reason.find("no CUDA device is usable"), std::string::npos) << c.reason;
  EXPECT_NE(c.reason.find("CUDA_VISIBLE_DEVICES="), std::string::npos) << c.reason;
  // An NVIDIA driver older than the CUDA 13 runtime (before R580): said so, with versions.
  c = ChooseAutoBackend(true, absl::OkStatus(), 0,
                        cuda::DeviceCountError(35, "cudaErrorInsufficientDriver",
                                               "CUDA driver version is insufficient for CUDA "
                                               "runtime version",
                                               12040, 13000));
  EXPECT_TRUE(c.fallback);
  for (const char* want : {"cudaErrorInsufficientDriver (35)", "insufficient", "CUDA 12.4",
                           "runtime 13.0", "R580", "NVIDIA_VISIBLE_DEVICES="}) {
    EXPECT_NE(c.reason.find(want), std::string::npos) << want << ": " << c.reason;
  }
  // The same error with no driver loaded at all (cudaDriverGetVersion says 0).
  c = ChooseAutoBackend(true, absl::OkStatus(), 0,
                        cuda::DeviceCountError(35, "cudaErrorInsufficientDriver", "x", 0, 13000));
  EXPECT_NE(c.reason.find("no NVIDIA driver was found"), std::string::npos) << c.reason;
  EXPECT_EQ(c.reason.find("R580"), std::string::npos) << c.reason;
  // A driver without a GPU (none allocated to the container).
  c = ChooseAutoBackend(true, absl::OkStatus(), 0,
                        cuda::DeviceCountError(100, "cudaErrorNoDevice",
                                               "no CUDA-capable device is detected", 13000,
                                               13000));
  EXPECT_NE(c.reason.find("cudaErrorNoDevice (100): no CUDA-capable device is detected"),
            std::string::npos)
      << c.reason;
  EXPECT_NE(c.reason.find("none was given to this process"), std::string::npos) << c.reason;
  // Any other error: its name and description as CUDA gives them.
  const absl::Status other = cuda::DeviceCountError(999, "cudaErrorUnknown", "unknown error", 0, 0);
  EXPECT_EQ(other.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(other.message(), "cudaGetDeviceCount: cudaErrorUnknown (999): unknown error");

  c = ChooseAutoBackend(true, absl::OkStatus(), 2);
  EXPECT_EQ(c.kind, BackendKind::kCuda);
  EXPECT_FALSE(c.fallback);
  EXPECT_NE(c.reason.find("2 CUDA device(s) visible"), std::string::npos) << c.reason;

  // This machine's answer is the one ResolveBackendKind gives.
  EXPECT_EQ(ChooseAutoBackend().kind, ResolveBackendKind(BackendKind::kAuto));
}

// cuda-sim is in every build: the CUDA backend's kernels on the SIMT emulator, bfloat16 by
// default like a GPU, float32 on request.
TEST(BackendFactoryTest, CudaSimIsAlwaysAvailable) {
  BackendOptions o;
  o.kind = BackendKind::kCudaSim;
  auto m = LoadModel(testing::GoldenDir("dcformer-f32-short-prompt"), o);
  ASSERT_TRUE(m.ok()) << m.status();
  BackendInfo info = m->backend->info();
  EXPECT_EQ(info.name, "cuda-sim");
  EXPECT_EQ(info.dtype, DType::kBF16);
  EXPECT_FALSE(info.device.empty());
  // Cache blocks hold 16-bit rows: half the bytes of the CPU's f32 rows.
  BackendOptions cpu;
  cpu.kind = BackendKind::kCpu;
  auto c = LoadModel(testing::GoldenDir("dcformer-f32-short-prompt"), cpu);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(2 * m->backend->BytesPerBlock(LayerGroup::kGlobal, 16),
            c->backend->BytesPerBlock(LayerGroup::kGlobal, 16));
  o.dtype = DType::kF32;
  m = LoadModel(testing::GoldenDir("dcformer-f32-short-prompt"), o);
  ASSERT_TRUE(m.ok()) << m.status();
  info = m->backend->info();
  EXPECT_EQ(info.name, "cuda-sim");
  EXPECT_EQ(info.dtype, DType::kF32);
}

// The cpu backend keeps the checkpoint's dtype (F32 stays F32, F16 stays F16) and converts
// when asked.
TEST(BackendFactoryTest, CpuKeepsTheCheckpointDtypeUnlessAsked) {
  BackendOptions o;
  o.kind = BackendKind::kCpu;
  const struct {
    const char* model;
    std::optional<DType> ask;
    DType want;
  } cases[] = {{"dcformer-f32-short-prompt", std::nullopt, DType::kF32},
               {"dcpythia-f16-bin", std::nullopt, DType::kF16},
               {"dcpythia-f16-bin", DType::kF32, DType::kF32},
               {"dcformer-f32-short-prompt", DType::kBF16, DType::kBF16},
               {"dcformer-f32-short-prompt", DType::kF16, DType::kF16}};
  for (const auto& c : cases) {
    o.dtype = c.ask;
    auto m = LoadModel(testing::GoldenDir(c.model), o);
    ASSERT_TRUE(m.ok()) << c.model << ": " << m.status();
    EXPECT_EQ(m->backend->info().dtype, c.want)
        << c.model << " asked " << (c.ask ? ComputeDTypeName(*c.ask) : "nothing");
  }
}

TEST(BackendFactoryTest, RefusesWhatCannotRunWithAClearError) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is visible";
  BackendOptions o;
  o.kind = BackendKind::kCuda;
  const absl::Status c = LoadModel(testing::GoldenDir("dcformer-f32-short-prompt"), o).status();
  EXPECT_EQ(c.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(c.message().find("cuda"), std::string::npos) << c.message();
  // A CUDA build whose plugin loads on this machine (no GPU, no driver): the message carries
  // the real CUDA error (e.g. cudaErrorInsufficientDriver without a driver), and --backend
  // auto's reason the same one.
  const AutoBackendChoice choice = ChooseAutoBackend();
  if (CudaBackendBuilt() && choice.reason.find("plugin did not load") == std::string::npos) {
    EXPECT_NE(c.message().find("cudaGetDeviceCount: cudaError"), std::string::npos)
        << c.message();
    const std::string error(c.message().substr(c.message().find("cudaGetDeviceCount")));
    EXPECT_NE(choice.reason.find(error), std::string::npos) << choice.reason;
  }
}

}  // namespace
}  // namespace dcf
