// CUDA's function qualifiers for the SIMT emulator: in a host build a kernel is an ordinary
// function, so they expand to nothing (or to `inline`). __restrict__ is a GCC keyword already.
// __shared__ and __constant__ are deliberately not provided: kernels declare shared memory
// with DCF_SHARED / DCF_DYNAMIC_SHARED (cuda_compat.h), and using the raw keywords gives a
// compile error that names the replacement.
#pragma once

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ DCF_SIMT_ERROR_use_DCF_SHARED_or_DCF_DYNAMIC_SHARED_instead_of___shared__
#define __constant__ DCF_SIMT_ERROR___constant___memory_is_not_supported
