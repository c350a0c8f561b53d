// Helpers of the backend conformance tests (backend_conformance*_test.cc, one binary:
// backend_conformance_test): the backends under test, a golden model loaded through the
// factory in float32, and BackendTest, the fixture of the tests that run on each backend
// (instantiated once, in backend_conformance_util.cc, as Backends/<test>/cpu and /cuda_sim).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backends/backend_factory.h"
#include "engine/execution/backend_options.h"
#include "engine/weights/dtype.h"
#include "gtest/gtest.h"

namespace dcf::conformance_test {

// The backends under test, in float32 (cuda-sim then reproduces the CPU to rounding).
const std::vector<BackendKind>& Backends();

// The golden model `model` on `kind` in float32 (LoadModel); `kv_cache_dtype` on the cpu.
absl::StatusOr<LoadedModel> Load(const std::string& model, BackendKind kind,
                                 DType kv_cache_dtype = DType::kF32);

// BackendKindName with '_' for '-' (a test name part: "cuda_sim").
std::string KindName(BackendKind k);

// The tests that run on every backend of Backends() (TEST_P in several files).
class BackendTest : public ::testing::TestWithParam<BackendKind> {};

}  // namespace dcf::conformance_test
