#include "tests/unit/backends/backend_conformance_util.h"

#include <algorithm>

#include "tests/testing/golden.h"

namespace dcf::conformance_test {

const std::vector<BackendKind>& Backends() {
  static const std::vector<BackendKind> kinds = {BackendKind::kCpu, BackendKind::kCudaSim};
  return kinds;
}

absl::StatusOr<LoadedModel> Load(const std::string& model, BackendKind kind, DType kv_cache_dtype) {
  BackendOptions o;
  o.kind = kind;
  o.dtype = DType::kF32;
  if (kind == BackendKind::kCpu) o.kv_cache_dtype = kv_cache_dtype;
  return LoadModel(testing::GoldenDir(model), o);
}

std::string KindName(BackendKind k) {
  std::string n = BackendKindName(k);
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendTest, ::testing::ValuesIn(Backends()),
                         [](const auto& info) { return KindName(info.param); });

}  // namespace dcf::conformance_test
