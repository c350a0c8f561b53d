// Defines dcf::cuda::{sim,gpu}::CreateBackend and VisibleDeviceCount for this build.
// cuda_backend.h opens this build's namespace as inline first (cuda_compat.h), so the plain
// `namespace sim` / `namespace gpu` of cuda_backend_factory.h, included after it, re-opens
// that same namespace: the declarations below and the header's are the same functions.
#include "engine/cuda/cuda_backend.h"
// Must come after cuda_backend.h (see above).
#include "engine/cuda/cuda_backend_factory.h"

namespace dcf::cuda {
inline namespace DCF_CUDA_NS {

int VisibleDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // "no driver" / "no device" are not sticky
    return 0;
  }
  return count;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const ModelConfig& config,
                                                       ModelWeights weights,
                                                       const BackendOptions& options) {
  absl::StatusOr<std::unique_ptr<CudaBackend>> b =
      CudaBackend::Create(config, std::move(weights), options);
  if (!b.ok()) return b.status();
  return std::unique_ptr<Backend>(std::move(*b));
}

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda
