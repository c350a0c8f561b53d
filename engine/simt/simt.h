// The SIMT emulator's kernel-facing and host-facing names, all in one include. Included by
// engine/simt/cuda_compat.h when DCF_CUDA_SIM is defined; nothing else includes it directly.
// The contract (what kernels may use, what is checked) is documented in cuda_compat.h.
#pragma once

#include "engine/simt/atomics.h"
#include "engine/simt/builtins.h"
#include "engine/simt/device_math.h"
#include "engine/simt/fp8_types.h"
#include "engine/simt/half_types.h"
#include "engine/simt/launch.h"
#include "engine/simt/qualifiers.h"
#include "engine/simt/runtime.h"
#include "engine/simt/runtime_types.h"
#include "engine/simt/shared_memory.h"
#include "engine/simt/trace.h"
#include "engine/simt/vector_types.h"
#include "engine/simt/warp_ops.h"
