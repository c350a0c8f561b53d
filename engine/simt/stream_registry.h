// Which stream handles are live in the SIMT emulator (the null stream always is). Thread-safe.
#pragma once

#include "engine/simt/runtime_types.h"

namespace dcf::simt::detail {

bool IsLiveStream(cudaStream_t stream);

}  // namespace dcf::simt::detail
