#include "engine/simt/cuda_compat.h"  // built with DCF_CUDA_SIM
#include "tests/unit/simt/toolkit/conversions.h"

namespace dcf::cuda_test::sim_host {
#include "tests/unit/simt/toolkit/conversions.inc"
}  // namespace dcf::cuda_test::sim_host
