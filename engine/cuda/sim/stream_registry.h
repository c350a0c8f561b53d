// Which stream handles are live in the SIMT emulator (the null stream always is). Thread-safe.
#pragma once

#include "engine/cuda/sim/runtime_types.h"

namespace dcf::simt::detail {

bool IsLiveStream(cudaStream_t stream);

}  // namespace dcf::simt::detail
