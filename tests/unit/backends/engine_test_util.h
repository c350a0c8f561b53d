// Helpers of the engine tests on real backends (engine_*_test.cc, one binary:
// backends_engine_test): the golden model on the cpu backend or on cuda-sim built directly
// (the backend factory sits above the engine), cached solo greedy references, greedy
// requests, an engine over a fresh backend, an observer that counts the engine's hooks, and
// EngineBackendTest, the fixture of the tests that run on both backends (instantiated once,
// in engine_test_util.cc, as Backends/<test>/cpu and /cuda_sim). Built with CMake's
// DCFORMER_ENGINE_TEST_CUDA_SIM off (DCF_ENGINE_TEST_CUDA_SIM 0), the binary has no cuda-sim:
// EngineBackendTest runs on cpu only and the cuda-sim cases are not compiled.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "engine/execution/backend.h"
#include "engine/execution/backend_options.h"
#include "engine/serving/engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/weights/int8_quant.h"
#include "gtest/gtest.h"
#include "tests/testing/collected_stream.h"

namespace dcf::engine_test {

inline constexpr char kModel[] = "dcformer-f32-long-prompt";

// Whether this binary has the cuda-sim backend (LoadBackend(kCudaSim)).
inline constexpr bool kHaveCudaSim = DCF_ENGINE_TEST_CUDA_SIM;

// The golden model in float32 on the CPU backend or on cuda-sim, built directly (the backend
// factory sits above the engine). `corrupt`: every 7th entry of layer 1's wo is NaN.
// `int8`: the cpu backend's matrices (cpu only; engine/weights/int8_quant.h).
std::unique_ptr<Backend> LoadBackend(BackendKind kind = BackendKind::kCpu, bool corrupt = false,
                                     Int8Matrices int8 = {});

// BackendKindName with '_' for '-' (a test name part: "cuda_sim").
std::string KindName(BackendKind k);

// `len` ids in [3, 293) from `seed`.
std::vector<int32_t> RandomPrompt(int len, uint64_t seed);

// Greedy reference, cached: one sequence alone on a backend of `kind`, prompt fed in chunks
// of 16. Not thread-safe (the tests call it from their own thread only).
std::vector<int32_t> Reference(const std::vector<int32_t>& prompt, int max_new,
                               BackendKind kind = BackendKind::kCpu, Int8Matrices int8 = {});

// A greedy request of `max_new` tokens, without text.
GenerationRequest Greedy(const std::vector<int32_t>& prompt, int max_new);

using testing::Collected;
using testing::RunToEnd;

// An engine over a fresh LoadBackend(kind, false, int8); `tok` may be null.
std::unique_ptr<Engine> MakeEngine(EngineOptions options, const Tokenizer* tok = nullptr,
                                   BackendKind kind = BackendKind::kCpu, Int8Matrices int8 = {});

struct Case {
  int len, max_new;
};
// Short prompts with long generations: the first three alone outgrow a 12-block pool.
extern const std::vector<Case> kGrowingCases;

// Counts the observer hooks (called on the loop thread; read after the engine is idle).
class CountingObserver : public EngineObserver {
 public:
  void OnStep(int num_seqs, int num_tokens, int num_prefill_tokens,
              absl::Duration step_time) override {
    absl::MutexLock l(&mu);
    ++steps;
    step_times += step_time;
    tokens += num_tokens;
    prefill_tokens += num_prefill_tokens;
    max_seqs = std::max(max_seqs, num_seqs);
  }
  void OnPreemption() override {
    absl::MutexLock l(&mu);
    ++preemptions;
  }
  void OnFirstToken(int, absl::Duration) override {
    absl::MutexLock l(&mu);
    ++first_tokens;
  }
  void OnInterTokenLatency(int, absl::Duration) override {
    absl::MutexLock l(&mu);
    ++later_tokens;
  }
  void OnNonFiniteLogits() override {
    absl::MutexLock l(&mu);
    ++nonfinite;
  }
  void OnFinished(int, const GenerationChunk& c) override {
    absl::MutexLock l(&mu);
    ++finished;
    generated += c.usage.generated_tokens;
  }
  absl::Mutex mu;
  int64_t steps = 0, tokens = 0, prefill_tokens = 0, preemptions = 0, first_tokens = 0,
          later_tokens = 0, finished = 0, generated = 0, nonfinite = 0;
  int max_seqs = 0;
  absl::Duration step_times;  // summed
};

// The tests that run on the cpu backend and on cuda-sim (TEST_P in several files).
class EngineBackendTest : public ::testing::TestWithParam<BackendKind> {};

}  // namespace dcf::engine_test
