// Kernels of the stream, graph and schedule tests (streams_graphs_test.cc). Each launcher
// returns the launch's cudaGetLastError() and only queues the work.
#pragma once

#include "engine/simt/cuda_compat.h"

namespace dcf::cuda_test {
inline namespace DCF_CUDA_NS {

// out[i] = a * in[i] + b for i < n.
cudaError_t LaunchAxpb(const float* in, float* out, float a, float b, int n, cudaStream_t stream);

// Records the order of execution: thread_rank[block * threads + t] is the rank of thread t
// among its block's threads at a point between two barriers (atomicAdd on shared memory);
// block_rank[block] the rank of the block's second phase among all blocks (atomicAdd on
// *counter, zeroed by the caller).
cudaError_t LaunchOrder(unsigned int* counter, unsigned int* block_rank,
                        unsigned int* thread_rank, int blocks, int threads, cudaStream_t stream);

// *sum += in[i] for i < n with float atomicAdd (the order of the additions is the schedule's).
cudaError_t LaunchFloatSum(const float* in, float* sum, int n, cudaStream_t stream);

}  // namespace DCF_CUDA_NS
}  // namespace dcf::cuda_test
