// A library built by dcf_add_cuda_library in both ways, declared for a plain C++ caller that
// links both builds into one binary (as a server offering --backend cuda and cuda-sim will).
// The definitions live in `inline namespace DCF_CUDA_NS` (cuda_compat.h), i.e. `sim` or `gpu`.
#pragma once

namespace dcf::cuda_test {
namespace sim {
// Squares x on the device; returns the cudaError_t value (0 on success).
int SquareOnDevice(int x, int* result);
}  // namespace sim
namespace gpu {
int SquareOnDevice(int x, int* result);
}  // namespace gpu
}  // namespace dcf::cuda_test
