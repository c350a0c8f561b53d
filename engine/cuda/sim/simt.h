// The SIMT emulator's kernel-facing and host-facing names, all in one include. Included by
// engine/cuda/cuda_compat.h when DCF_CUDA_SIM is defined; nothing else includes it directly.
// The contract (what kernels may use, what is checked) is documented in cuda_compat.h.
#pragma once

#include "engine/cuda/sim/atomics.h"
#include "engine/cuda/sim/builtins.h"
#include "engine/cuda/sim/device_math.h"
#include "engine/cuda/sim/half_types.h"
#include "engine/cuda/sim/launch.h"
#include "engine/cuda/sim/qualifiers.h"
#include "engine/cuda/sim/runtime.h"
#include "engine/cuda/sim/runtime_types.h"
#include "engine/cuda/sim/shared_memory.h"
#include "engine/cuda/sim/vector_types.h"
#include "engine/cuda/sim/warp_ops.h"
